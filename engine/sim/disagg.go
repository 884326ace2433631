package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/kv"
)

// Disaggregated prefill/decode in the sim (engine.Request.Leg).
//
// A LegPrefill request computes its prompt and samples one token. If that
// output is final (a stop token, or the request wanted one token) it ends
// like any request. Otherwise its last chunk carries the sim's connector
// parameters (Handoff, JSON): the rank's control endpoint, the request id,
// the prompt's full blocks by engine hash and an expiry; the rank keeps
// those blocks pinned until the decode side releases them (ReleaseHandoff,
// the transfer protocol's release frame), a peer has read the last of them
// (HandoffServed), or the expiry passes.
//
// A LegDecode request carries those parameters whole. Before it is queued,
// the configured HandoffPuller pulls the named blocks it lacks from the
// prefill rank (checksummed, as a peer fetch is) and inserts them; whatever
// did not arrive — bad parameters, an unreachable or restarted source, an
// expired pin — is recomputed, so the request still succeeds. Unless its
// pull read the handoff's last block (which released the pin already), the
// decode leg then tells the prefill rank it is done (DisaggConfig.Release),
// whether it pulled, failed, or held every block already: the pin goes at
// once instead of at the expiry.

// HandoffVersion tags the sim's connector parameters.
const HandoffVersion = 1

// DefaultHandoffTTL is how long a prefill rank pins a handoff's blocks when
// no decode reads them.
const DefaultHandoffTTL = 30 * time.Second

// Handoff is the sim's connector parameters: what a prefill rank answers
// and a decode rank pulls with.
type Handoff struct {
	Version   int             `json:"kvmesh_sim_handoff"`
	Endpoint  string          `json:"endpoint"` // the prefill rank's control endpoint ("" if it serves none)
	DPRank    int             `json:"dp_rank"`
	RequestID string          `json:"request_id"`
	Digest    string          `json:"digest"`
	Hashes    []kv.EngineHash `json:"block_hashes"` // the prompt's pinned full blocks, from the root
	Expires   time.Time       `json:"expires_at"`
}

// ParseHandoff reads the sim's connector parameters; unknown keys are
// ignored, a wrong version or a missing field is an error.
func ParseHandoff(b []byte) (*Handoff, error) {
	var h Handoff
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("sim handoff parameters: %w", err)
	}
	switch {
	case h.Version != HandoffVersion:
		return nil, fmt.Errorf("sim handoff parameters: version %d, want %d", h.Version, HandoffVersion)
	case h.RequestID == "":
		return nil, errors.New("sim handoff parameters: no request_id")
	case h.DPRank < 0:
		return nil, fmt.Errorf("sim handoff parameters: dp_rank %d", h.DPRank)
	}
	return &h, nil
}

// HandoffPuller pulls the blocks of h that the decode request lacks (the
// leading run of m the handoff names) and inserts them with into. It
// returns the bytes received; its error is counted and the rest recomputed.
type HandoffPuller func(ctx context.Context, req *engine.Request, h *Handoff, m Missing, into Inserter) (inserted int, bytes int64, err error)

// DisaggConfig configures the sim's prefill/decode legs.
type DisaggConfig struct {
	// Puller pulls a decode leg's blocks (worker.Peer.PullHandoff); nil:
	// decode legs recompute their prompt.
	Puller HandoffPuller
	// Endpoint is DP rank r's control endpoint, named in the handoff (nil
	// or "": none, and decode legs recompute).
	Endpoint func(rank int) string
	// TTL is how long an unread handoff stays pinned; default
	// DefaultHandoffTTL. It is the fallback when no release comes.
	TTL time.Duration
	// Release tells the prefill rank named in h that the decode leg is done
	// with it (worker.Peer.ReleaseHandoff); it runs on its own goroutine
	// and its error is only counted. nil: pins go at a read of their last
	// block or at the TTL.
	Release func(ctx context.Context, h *Handoff) error
}

// HandoffStats counts the legs a sim served (engine.Handoffs).
type HandoffStats = engine.HandoffStats

// handoffs is one rank's pinned prefill answers and its leg counters.
type handoffs struct {
	mu     sync.Mutex
	byLast map[kv.SeqHash][]*pinned // by the handoff's last block
	byID   map[string]*pinned       // by request id

	prefills, final, read, expired, released, relSent, relErr atomic.Uint64
	pinnedN, pinnedBlocks                                     atomic.Int64
	decodes, pulls, pulled, bytes, nanos, failures, recomput  atomic.Uint64
}

type pinned struct {
	id      string
	last    kv.SeqHash
	blocks  int
	release func()
	timer   *time.Timer
	done    bool
}

// HandoffStats sums the counters over every rank.
func (e *Engine) HandoffStats() HandoffStats {
	var s HandoffStats
	for _, r := range e.ranks() {
		h := &r.ho
		s.Prefills += h.prefills.Load()
		s.FinalPrefills += h.final.Load()
		s.PinnedHandoffs += h.pinnedN.Load()
		s.PinnedBlocks += h.pinnedBlocks.Load()
		s.Read += h.read.Load()
		s.Expired += h.expired.Load()
		s.Released += h.released.Load()
		s.ReleasesSent += h.relSent.Load()
		s.ReleaseErrors += h.relErr.Load()
		s.Decodes += h.decodes.Load()
		s.Pulls += h.pulls.Load()
		s.PulledBlks += h.pulled.Load()
		s.PullBytes += h.bytes.Load()
		s.PullNanos += h.nanos.Load()
		s.Failures += h.failures.Load()
		s.Recomputes += h.recomput.Load()
	}
	return s
}

// HandoffServed tells this rank that a peer read the blocks hashes (the
// transfer source calls it after sending them): a pinned handoff whose
// last block was among them has been read and is released.
func (e *Engine) HandoffServed(hashes []kv.SeqHash) {
	h := &e.ho
	h.mu.Lock()
	var rel []*pinned
	for _, s := range hashes {
		if ps := h.byLast[s]; len(ps) > 0 {
			rel = append(rel, ps[0]) // one reader releases one handoff
			if len(ps) == 1 {
				delete(h.byLast, s)
			} else {
				h.byLast[s] = ps[1:]
			}
		}
	}
	h.mu.Unlock()
	for _, p := range rel {
		if e.unpin(p) {
			h.read.Add(1)
		}
	}
}

// ReleaseHandoff unpins the handoff of request id on this rank, at the
// decode side's word (the transfer protocol's release frame); false when
// none is pinned by that id (read, released, expired or never made).
func (e *Engine) ReleaseHandoff(id string) bool {
	e.ho.mu.Lock()
	p := e.ho.byID[id]
	e.ho.mu.Unlock()
	if p != nil && e.unpin(p) {
		e.ho.released.Add(1)
		return true
	}
	return false
}

// unpin releases p once; it reports whether this call did.
func (e *Engine) unpin(p *pinned) bool {
	h := &e.ho
	h.mu.Lock()
	if p.done {
		h.mu.Unlock()
		return false
	}
	p.done = true
	if h.byID[p.id] == p {
		delete(h.byID, p.id)
	}
	if ps := h.byLast[p.last]; len(ps) > 0 {
		out := ps[:0]
		for _, q := range ps {
			if q != p {
				out = append(out, q)
			}
		}
		if len(out) == 0 {
			delete(h.byLast, p.last)
		} else {
			h.byLast[p.last] = out
		}
	}
	h.mu.Unlock()
	p.timer.Stop()
	p.release()
	h.pinnedN.Add(-1)
	h.pinnedBlocks.Add(-int64(p.blocks))
	return true
}

// generatePrefill runs a LegPrefill request on rank e: one token, then the
// handoff (see the file comment).
func (e *Engine) generatePrefill(ctx context.Context, req *engine.Request) (<-chan engine.Chunk, error) {
	one := *req
	one.Leg = kv.LegWhole // a prefill computes like a whole request, hint included
	one.MaxTokens = 1
	in, err := e.Generate(ctx, &one)
	if err != nil {
		return nil, err
	}
	out := make(chan engine.Chunk, 1)
	go func() {
		defer close(out)
		for c := range in {
			if c.Finish == kv.FinishLength && req.MaxTokens > 1 && c.Err == nil {
				c.TransferParams = e.pinHandoff(req)
			} else if c.Finish != kv.FinishNone {
				e.ho.final.Add(1)
			}
			select {
			case out <- c:
			case <-ctx.Done():
				// The caller left: nothing will read the handoff.
				if c.TransferParams != nil {
					e.dropHandoff(req.ID)
				}
				for range in {
				}
				return
			}
		}
	}()
	return out, nil
}

// pinHandoff pins req's prompt blocks on this rank and returns the
// handoff's JSON.
func (e *Engine) pinHandoff(req *engine.Request) []byte {
	bs := e.cfg.BlockSize
	local := kv.LocalHashes(nil, req.Tokens, bs, kv.Seed(req.LoRA, req.CacheSalt))
	seq := kv.SeqHashes(nil, local)
	ids, release := e.PinBlocks(seq)
	n := len(ids)
	ttl := e.cfg.Disagg.TTL
	if ttl <= 0 {
		ttl = DefaultHandoffTTL
	}
	h := Handoff{Version: HandoffVersion, DPRank: e.rank, RequestID: req.ID, Digest: e.cfg.Digest,
		Hashes: make([]kv.EngineHash, n), Expires: time.Now().Add(ttl).UTC()}
	if f := e.cfg.Disagg.Endpoint; f != nil {
		h.Endpoint = f(e.rank)
	}
	for i := range n {
		h.Hashes[i] = EngineHash(seq[i])
	}
	e.ho.prefills.Add(1)
	if n == 0 {
		release()
	} else {
		p := &pinned{id: req.ID, last: seq[n-1], blocks: n, release: release}
		ho := &e.ho
		ho.mu.Lock()
		if ho.byLast == nil {
			ho.byLast = map[kv.SeqHash][]*pinned{}
		}
		ho.byLast[p.last] = append(ho.byLast[p.last], p)
		if ho.byID == nil {
			ho.byID = map[string]*pinned{}
		}
		ho.byID[req.ID] = p
		p.timer = time.AfterFunc(ttl, func() {
			if e.unpin(p) {
				ho.expired.Add(1)
			}
		})
		ho.mu.Unlock()
		ho.pinnedN.Add(1)
		ho.pinnedBlocks.Add(int64(n))
	}
	b, _ := json.Marshal(&h) // plain fields: cannot fail
	return b
}

// dropHandoff releases the handoff of request id, if still pinned.
func (e *Engine) dropHandoff(id string) {
	e.ho.mu.Lock()
	p := e.ho.byID[id]
	e.ho.mu.Unlock()
	if p != nil {
		e.unpin(p)
	}
}

// fetcherFor is the fetch step of req before it is queued: a decode leg
// pulls its handoff, anything else uses the configured Fetcher (hints).
// done, when not nil, is called once the fetch step is over (also when
// nothing was missing): a decode leg then releases its handoff.
func (e *Engine) fetcherFor(req *engine.Request) (f Fetcher, done func()) {
	if req.Leg != kv.LegDecode {
		return e.cfg.Fetcher, nil
	}
	ho := &e.ho
	ho.decodes.Add(1)
	h, err := ParseHandoff(req.TransferParams)
	if err != nil || e.cfg.Disagg.Puller == nil || h.Endpoint == "" {
		// Nothing to pull with: recompute (counted once it is known that
		// something was missing, in the returned fetcher).
		f = func(context.Context, *engine.Request, Missing, Inserter) error {
			ho.recomput.Add(1)
			if err != nil {
				return err
			}
			return errors.New("sim: decode leg without a source to pull from; recomputing")
		}
		if err != nil || h.Endpoint == "" {
			return f, nil
		}
		return f, func() { e.releaseHandoff(h) }
	}
	readLast := false // the pull read the handoff's last block: the source unpinned on it
	f = func(ctx context.Context, req *engine.Request, m Missing, into Inserter) error {
		t0 := time.Now()
		n, b, err := e.cfg.Disagg.Puller(ctx, req, h, m, into)
		ho.pulls.Add(1)
		ho.pulled.Add(uint64(n))
		ho.bytes.Add(uint64(max(b, 0)))
		ho.nanos.Add(uint64(time.Since(t0)))
		if err != nil {
			ho.failures.Add(1)
		}
		if n < len(m.Seq) {
			ho.recomput.Add(1)
		}
		readLast = n > 0 && n <= len(m.Seq) && len(h.Hashes) > 0 && EngineHash(m.Seq[n-1]) == h.Hashes[len(h.Hashes)-1]
		return err
	}
	return f, func() {
		if !readLast {
			e.releaseHandoff(h)
		}
	}
}

// releaseHandoff tells h's prefill rank, on its own goroutine, that this
// decode leg is done with it. The engine's Close waits for it (bounded by
// a short timeout, and cut by the close).
func (e *Engine) releaseHandoff(h *Handoff) {
	rel := e.cfg.Disagg.Release
	if rel == nil || len(h.Hashes) == 0 {
		return // nothing pinned for it
	}
	ho := &e.ho
	ho.relSent.Add(1)
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		ctx, cancel := context.WithTimeout(e.ctx, 2*time.Second)
		defer cancel()
		if err := rel(ctx, h); err != nil {
			ho.relErr.Add(1)
		}
	}()
}
