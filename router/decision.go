package router

import (
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// Decision is one routing decision and the handle on the load it booked.
// FirstToken, Done and Fail are idempotent and safe to call from any
// goroutine.
type Decision struct {
	ID     string       // selection id, unique per router replica
	Worker kv.WorkerKey // the chosen worker key
	// Overlap is the chosen worker's cumulative depth per tier, as the
	// index reported it (see Match); TierBlocks splits it per tier.
	Overlap [kv.NumTiers]uint32
	// Local and Seq are the request's full-block local and sequence hashes,
	// so downstream code need not rehash. Read-only.
	Local     []kv.LocalHash
	Seq       []kv.SeqHash
	BlockSize int
	ISL       int // prompt tokens
	// CachedTokens is the prefix the router predicts the worker will not
	// recompute (held on any tier); PrefillTokens = ISL − CachedTokens is
	// what it booked as prefill load.
	CachedTokens  int
	PrefillTokens int
	// ReachableTokens is the longest prefix any eligible worker holds (any
	// tier, clamped to the prompt) and RoutedTokens what the chosen one
	// holds: their gap is the cache hit this decision gave away. Both are
	// measured even where the mode gives no overlap credit (round-robin
	// with a Matcher), so CachedTokens may be less than RoutedTokens.
	ReachableTokens int
	RoutedTokens    int
	// Hint, when non-nil, names a peer holding a longer prefix than the
	// chosen worker (Config.Hints), by the peer's own engine hashes; the
	// chosen worker holds Overlap[kv.NumTiers-1] of those blocks already.
	Hint *kv.Hint
	// Timing is the wall time this decision took, by stage.
	Timing Timing

	r *Router
	a *active
}

// Timing is a decision's overhead by stage: hashing the prompt, asking the
// index, and scoring + booking (lock, cost model, load, hint plan).
type Timing struct {
	Hash, Match, Score, Total time.Duration
}

// TierBlocks returns the chosen worker's overlap split per tier: blocks of
// the matched prefix first found on each tier (device, host-only, …).
func (d *Decision) TierBlocks() [kv.NumTiers]uint32 {
	var out [kv.NumTiers]uint32
	var prev uint32
	for t, v := range d.Overlap {
		v = max(v, prev)
		out[t] = v - prev
		prev = v
	}
	return out
}

// FirstToken marks the request's prefill as done: its prefill tokens stop
// counting against the worker.
func (d *Decision) FirstToken() {
	if d == nil || d.r == nil {
		return
	}
	d.r.prefillDone(d.a, true)
}

// Done frees the request's load (end of stream, error or cancellation).
func (d *Decision) Done() {
	if d == nil || d.r == nil {
		return
	}
	d.r.done(d.a, true)
}

// Fail is Done for a request its worker failed (unreachable, stream
// broken): the worker is also kept out of selection for Config.InhibitFor.
func (d *Decision) Fail() {
	if d == nil || d.r == nil {
		return
	}
	d.r.Inhibit(d.Worker)
	d.r.done(d.a, true)
}

func (r *Router) prefillDone(a *active, emit bool) {
	r.mu.Lock()
	if a.freed || a.prefill == 0 {
		r.mu.Unlock()
		return
	}
	a.load.prefillDone(a)
	r.chg.Add(1)
	r.mu.Unlock()
	if emit && r.cfg.OnReplicaEvent != nil {
		r.cfg.OnReplicaEvent(ReplicaEvent{Kind: ReplicaFirstToken, Router: r.cfg.RouterID, Decision: a.id, Worker: a.load.key})
	}
}

func (r *Router) done(a *active, emit bool) {
	r.mu.Lock()
	if a.freed {
		r.mu.Unlock()
		return
	}
	if !a.start.IsZero() {
		a.load.observeResidency(r.cfg.Now().Sub(a.start))
	}
	r.freeLocked(a)
	delete(r.active, a.id)
	r.mu.Unlock()
	if emit && r.cfg.OnReplicaEvent != nil {
		r.cfg.OnReplicaEvent(ReplicaEvent{Kind: ReplicaFree, Router: r.cfg.RouterID, Decision: a.id, Worker: a.load.key})
	}
}
