package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// Router picks workers. It is safe for concurrent use.
type Router struct {
	cfg Config
	met *metrics
	// engHashes is the Matcher's EngineHasher (kv mode with hints).
	engHashes EngineHasher

	mu        sync.Mutex
	pools     map[poolKey]*pool
	workers   map[kv.WorkerKey]*worker
	loads     map[kv.WorkerKey]*load
	active    map[string]*active         // open decisions, ours and other replicas'
	inhibited map[kv.WorkerKey]time.Time // failed workers, kept out of selection until then
	lastSweep time.Time

	nworkers atomic.Int64
	// chg counts changes of worker state that may change an admission
	// (Changes).
	chg atomic.Uint64
	// blind counts the workers without KV events (WorkerInfo.NoKVEvents),
	// kept as they are added, updated and removed (a recount per
	// registration made registering n workers O(n²)).
	blind   atomic.Int64
	seq     atomic.Uint64
	scratch sync.Pool // *selection
	prof    profile
}

// active is one open request's contribution to a worker's load.
type active struct {
	id      string
	load    *load
	seq     []kv.SeqHash // prompt blocks (refcounted in load.refs); read-only
	private int64        // blocks not shared with anyone (partial tail)
	prefill int64        // tokens still to prefill; 0 after the first token
	start   time.Time
	freed   bool
}

// New returns a Router for cfg (see Config for defaults).
func New(cfg Config) (*Router, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	met, err := newMetrics(cfg.Registerer, cfg.Mode)
	if err != nil {
		return nil, err
	}
	r := &Router{
		cfg:     cfg,
		met:     met,
		pools:   make(map[poolKey]*pool),
		workers: make(map[kv.WorkerKey]*worker),
		loads:   make(map[kv.WorkerKey]*load),
		active:  make(map[string]*active),

		inhibited: make(map[kv.WorkerKey]time.Time),
		prof:      profileOf(cfg.Mode, cfg.Admit != nil),
	}
	r.scratch.New = func() any { return new(selection) }
	if cfg.Hints && cfg.Mode == ModeKV {
		eh, ok := cfg.Matcher.(EngineHasher)
		if !ok {
			return nil, fmt.Errorf("%w: hints need a Matcher that reports engine hashes (EngineHasher, as *index.Index does)", errConfig)
		}
		r.engHashes = eh
	}
	return r, nil
}

// Mode is the router's selection mode.
func (r *Router) Mode() Mode { return r.cfg.Mode }

// ID is this replica's router id.
func (r *Router) ID() string { return r.cfg.RouterID }

// Request is what the router needs to know about one request.
type Request struct {
	Model  string
	Role   kv.Role // "" means aggregated
	Tokens []kv.Token
	// LoRA names the adapter: mixed into block hashes, and only workers
	// that serve it (WorkerInfo.LoRAs) are candidates or hint sources.
	LoRA string
	Salt string // cache salt, mixed into block hashes
	// Exclude lists workers not to pick (e.g. ones a migrating request
	// already failed on).
	Exclude []kv.WorkerKey
	// Cost overrides the router's cost model for this request (Dynamo's
	// router_config_override); nil uses Config.Cost.
	Cost *CostModel
	// Local, when non-nil, are the prompt's full-block local hashes as the
	// caller already computed them (kv.LocalHashes with the model's block
	// size and kv.Seed(LoRA, Salt)); Route uses them instead of hashing
	// Tokens, and the decision keeps them (do not modify). Tokens may then
	// be nil, with PromptLen giving the prompt's length in tokens.
	Local     []kv.LocalHash
	PromptLen int
	// Seq, optional with Local, are kv.SeqHashes of Local as an earlier
	// decision on the same prompt carries them (Decision.Seq): Route uses
	// them instead of chaining them again, and keeps them (do not modify).
	Seq []kv.SeqHash
	// Known, when set (and Local is not), are block hashes of Tokens'
	// first blocks made for an earlier prompt that Tokens start with (a
	// conversation's turn before, kv.PromptHashes): used when made with
	// this request's seed and the pool's block size, so only the blocks
	// past them are hashed. The caller vouches for the tokens.
	Known *kv.BlockHashes

	// NoOverlapCredit scores the request by load alone: cached prefixes
	// earn no credit, the decision reports no overlap and plans no hint.
	// NoPrefillCharge neither counts the prompt in the cost's prefill term
	// nor books it as prefill load (its blocks still count as decode
	// blocks). Both together are a disaggregated decode leg, whose KV
	// arrives from the prefill worker (see DecodeLegRequest).
	NoOverlapCredit bool
	NoPrefillCharge bool

	// Aged: the request has waited in the router queue past its age bound
	// (Queue.Aged). With Config.Admit it takes the best worker that
	// admits it now instead of waiting for a better one.
	Aged bool
}

// promptLen is the prompt's length in tokens.
func (req *Request) promptLen() int {
	if req.Tokens == nil && req.Local != nil {
		return req.PromptLen
	}
	return len(req.Tokens)
}

// Route picks a worker for req and books the request's load on it. The
// caller must call Done on the returned decision when the request ends for
// any reason, and FirstToken when its first token arrives.
func (r *Router) Route(ctx context.Context, req Request) (*Decision, error) {
	return r.route(ctx, req, true)
}

// Peek runs Route's selection for req without booking anything: no load,
// no hint, no replica event, no metrics, and the returned decision has no
// handle (its FirstToken, Done and Fail do nothing). It answers "which
// worker would Route pick now, and what does it hold": an ErrAllBusy
// error (*kv.BusyError) means every candidate is over a busy threshold.
// With a random pick or a softmax temperature, a later Route may pick
// differently.
func (r *Router) Peek(ctx context.Context, req Request) (*Decision, error) {
	return r.route(ctx, req, false)
}

// route hashes the prompt and matches it against the index outside the
// lock, then under it runs the mode's stages (choose) and books the
// decision; a peek (book false) stops before booking.
func (r *Router) route(ctx context.Context, req Request, book bool) (*Decision, error) {
	if err := checkRequest(ctx, &req); err != nil {
		return nil, err
	}
	t0, now := time.Now(), r.cfg.Now()
	pk := poolKey{req.Model, req.Role.Norm()}
	d := &Decision{r: r}
	if err := r.hashPrompt(pk, &req, d); err != nil {
		return nil, err
	}
	t1 := time.Now()
	s := r.scratch.Get().(*selection)
	defer r.scratch.Put(s)
	if req.NoOverlapCredit {
		// Its depths are zero whatever the index holds (mergeDepth).
		s.matches = s.matches[:0]
	} else {
		r.match(s, d.Local, now)
	}
	t2 := time.Now()

	r.mu.Lock()
	bk, err := r.selectLocked(s, pk, req, d, now, book)
	r.mu.Unlock()
	s.release()
	if err != nil {
		if book && errors.Is(err, kv.ErrAllBusy) {
			r.met.busy.Inc()
		}
		return nil, err
	}
	if !book {
		d.r = nil
		t3 := time.Now()
		d.Timing = Timing{Hash: t1.Sub(t0), Match: t2.Sub(t1), Score: t3.Sub(t2), Total: t3.Sub(t0)}
		return d, nil
	}
	r.afterBooking(d, bk, now)
	t3 := time.Now()
	d.Timing = Timing{Hash: t1.Sub(t0), Match: t2.Sub(t1), Score: t3.Sub(t2), Total: t3.Sub(t0)}
	r.met.observe(d, req.Model, pathOf(&req))
	return d, nil
}

// checkRequest rejects a request before any work: a done context, a cost
// override that does not validate.
func checkRequest(ctx context.Context, req *Request) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("router: %w", err)
	}
	if req.Cost != nil {
		if err := req.Cost.validate(); err != nil {
			return fmt.Errorf("router: request override: %w", err)
		}
	}
	return nil
}

// hashPrompt sets d's block size from pool pk, and its prompt length and
// hashes, computed outside the lock. The decision owns the slices: the
// hint planner, the worker and the load tracker read them later.
func (r *Router) hashPrompt(pk poolKey, req *Request, d *Decision) error {
	r.mu.Lock()
	p := r.pools[pk]
	if p != nil {
		d.BlockSize = p.blockSize
	}
	r.mu.Unlock()
	if p == nil {
		return fmt.Errorf("%w for model %q role %s", kv.ErrNoWorkers, pk.model, pk.role)
	}
	bs := d.BlockSize
	d.ISL = req.promptLen()
	if d.ISL < 0 {
		return fmt.Errorf("router: prompt length %d is negative", d.ISL)
	}
	n := kv.NumFullBlocks(d.ISL, bs)
	switch {
	case req.Local != nil:
		if len(req.Local) != n {
			return fmt.Errorf("router: %d precomputed local hashes for a prompt of %d tokens (%d full blocks of %d)", len(req.Local), d.ISL, n, bs)
		}
		if req.Seq != nil && len(req.Seq) != n {
			return fmt.Errorf("router: %d precomputed sequence hashes for %d local hashes", len(req.Seq), n)
		}
		if n > 0 {
			d.Local = req.Local
			d.Seq = req.Seq
			if d.Seq == nil {
				d.Seq = kv.SeqHashes(make([]kv.SeqHash, 0, n), d.Local)
			}
		}
	case n > 0:
		buf := make([]uint64, 2*n) // one allocation for both
		seed := kv.Seed(req.LoRA, req.Salt)
		local, seq := kv.AsHashes[kv.LocalHash](buf[:0:n]), kv.AsHashes[kv.SeqHash](buf[n:n:2*n])
		if k := knownBlocks(req.Known, seed, bs, n); k > 0 {
			local = append(local, req.Known.Local[:k]...)
			seq = append(seq, req.Known.Seq[:k]...)
		}
		k := len(local)
		d.Local = kv.LocalHashes(local, req.Tokens[k*bs:], bs, seed)
		d.Seq = kv.AppendSeqHashes(seq, d.Local[k:])
	}
	return nil
}

// knownBlocks is how many of a prompt's n full blocks known gives the
// hashes of: none unless made with the request's seed and the pool's
// block size (the hashes are a function of the tokens, the block size
// and the seed alone, and the tokens are vouched for).
func knownBlocks(known *kv.BlockHashes, seed uint64, bs, n int) int {
	if known == nil || known.Seed != seed || known.BlockSize != bs {
		return 0
	}
	return min(len(known.Local), len(known.Seq), n)
}

// match fills s.matches, sorted by worker, from the mode's index.
func (r *Router) match(s *selection, local []kv.LocalHash, now time.Time) {
	s.matches = s.matches[:0]
	if len(local) == 0 {
		return
	}
	switch r.cfg.Mode {
	case ModeKV:
		s.matches = r.cfg.Matcher.FindMatches(local, s.matches)
		if r.blind.Load() > 0 {
			// Workers without KV events: what the router sent them.
			if e, ok := r.cfg.Approx.(approxExpirer); ok {
				e.Expire(now)
			}
			s.matches = r.cfg.Approx.FindMatches(local, s.matches)
		}
	case ModeKVApprox:
		if e, ok := r.cfg.Approx.(approxExpirer); ok {
			e.Expire(now)
		}
		s.matches = r.cfg.Approx.FindMatches(local, s.matches)
	default:
		// Round-robin and random ignore the index for choosing; with one
		// they still measure what they could have reached (routing regret).
		if r.cfg.Matcher != nil {
			s.matches = r.cfg.Matcher.FindMatches(local, s.matches)
		}
	}
	if !slices.IsSortedFunc(s.matches, func(a, b Match) int { return cmpKey(a.Worker, b.Worker) }) {
		slices.SortFunc(s.matches, func(a, b Match) int { return cmpKey(a.Worker, b.Worker) })
	}
}

// booked is what a booking leaves to do outside the lock.
type booked struct {
	hint   hintPlan
	hinted bool
	ev     ReplicaEvent
	emit   bool
	// predicted: the worker's cache is known only from what was routed
	// to it (kv-approx, or a worker without KV events in kv mode).
	predicted bool
}

// selectLocked runs the stages for req over its pool and fills d's worker
// and prefix; with book it then books the decision. A peek leaves the
// round-robin cursor where it was. Called with r.mu held.
func (r *Router) selectLocked(s *selection, pk poolKey, req Request, d *Decision, now time.Time, book bool) (booked, error) {
	r.maybeSweep(now)
	p := r.pools[pk] // the pool may have changed while we hashed
	if p == nil {
		return booked{}, fmt.Errorf("%w for model %q role %s", kv.ErrNoWorkers, req.Model, pk.role)
	}
	if p.blockSize != d.BlockSize {
		return booked{}, fmt.Errorf("router: model %q changed block size while routing; retry", req.Model)
	}
	req.Exclude = r.exclusions(req.Exclude, now)
	s.r, s.p, s.req, s.seq, s.now, s.cm = r, p, req, d.Seq, now, r.cfg.Cost
	if req.Cost != nil {
		s.cm = req.Cost
	}
	rr := p.rr
	chosen, err := r.choose(s)
	if !book {
		p.rr = rr // a peek does not advance round-robin
	}
	if err != nil {
		return booked{}, err
	}
	d.Worker = p.workers[chosen].info.Key
	d.ReachableTokens, d.RoutedTokens = s.regret(chosen, d.BlockSize, d.ISL)
	if r.prof.scorer != nil { // a mode without a scorer credits no overlap
		d.Overlap = s.depth[chosen]
	}
	d.CachedTokens = min(int(d.Overlap[kv.NumTiers-1])*d.BlockSize, d.ISL)
	d.PrefillTokens = d.ISL - d.CachedTokens
	if req.NoPrefillCharge {
		d.PrefillTokens = 0
	}
	if !book {
		return booked{}, nil
	}
	return r.bookLocked(s, chosen, d), nil
}

// bookLocked books d's load on pool worker chosen and plans its hint.
// Called with r.mu held.
func (r *Router) bookLocked(s *selection, chosen int, d *Decision) booked {
	w := s.p.workers[chosen]
	d.ID = r.cfg.RouterID + "-" + strconv.FormatUint(r.seq.Add(1), 36)
	a := &active{id: d.ID, load: w.load, prefill: int64(d.PrefillTokens), start: s.now}
	if !r.cfg.NoBlockTracking {
		a.seq, a.private = d.Seq, int64(kv.BlocksNeeded(d.ISL, d.BlockSize)-len(d.Seq))
	}
	w.load.add(a, true)
	r.chg.Add(1)
	r.active[d.ID] = a
	d.a = a
	b := booked{predicted: r.cfg.Mode == ModeKVApprox || r.cfg.Mode == ModeKV && w.info.NoKVEvents}
	if r.engHashes != nil && !s.req.NoOverlapCredit {
		b.hint, b.hinted = planHint(s.p, chosen, s.depth, len(d.Seq), s.req.Exclude, r.cfg.HintPolicy, r.cfg.Logger)
	}
	if r.cfg.OnReplicaEvent != nil {
		b.ev = ReplicaEvent{Kind: ReplicaAdd, Router: r.cfg.RouterID, Decision: d.ID, Worker: d.Worker,
			PrefillTokens: a.prefill, PrivateBlocks: a.private, Blocks: a.seq}
		b.emit = true
	}
	return b
}

// afterBooking does what a booking leaves outside the lock: it resolves
// the hint, records the routing in kv-approx's index and tells the other
// replicas.
func (r *Router) afterBooking(d *Decision, b booked, now time.Time) {
	if b.hinted {
		d.Hint = r.resolveHint(d.ID, b.hint, d.Local)
	}
	if b.predicted && len(d.Local) > 0 {
		if si, ok := r.cfg.Approx.(approxSeqInserter); ok {
			si.InsertSeq(d.Worker, d.Local, d.Seq, now)
		} else {
			r.cfg.Approx.Insert(d.Worker, d.Local, now)
		}
	}
	if b.emit {
		r.cfg.OnReplicaEvent(b.ev)
	}
}

// maybeSweep frees requests older than MaxRequestAge, at most once per
// SweepInterval. Called with r.mu held.
func (r *Router) maybeSweep(now time.Time) {
	if now.Sub(r.lastSweep) < r.cfg.SweepInterval {
		return
	}
	r.lastSweep = now
	for id, a := range r.active {
		if now.Sub(a.start) > r.cfg.MaxRequestAge {
			r.freeLocked(a)
			delete(r.active, id)
			r.met.expired.Inc()
		}
	}
}

func (r *Router) freeLocked(a *active) {
	if a.freed {
		return
	}
	a.freed = true
	a.load.free(a)
	r.chg.Add(1)
	if a.load.idle() && !a.load.registered && r.loads[a.load.key] == a.load {
		delete(r.loads, a.load.key) // a replica-only entry with nothing left
	}
}
