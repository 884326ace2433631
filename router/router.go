package router

import (
	"context"
	"errors"
	"fmt"
	"math"
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
	// blind counts the workers without KV events (WorkerInfo.NoKVEvents).
	blind   atomic.Int64
	seq     atomic.Uint64
	scratch sync.Pool // *scratch
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
	}
	r.scratch.New = func() any { return new(scratch) }
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

	// NoOverlapCredit scores the request by load alone: cached prefixes
	// earn no credit, the decision reports no overlap and plans no hint.
	// NoPrefillCharge neither counts the prompt in the cost's prefill term
	// nor books it as prefill load (its blocks still count as decode
	// blocks). Both together are a disaggregated decode leg, whose KV
	// arrives from the prefill worker (see DecodeLegRequest).
	NoOverlapCredit bool
	NoPrefillCharge bool
}

// promptLen is the prompt's length in tokens.
func (req *Request) promptLen() int {
	if req.Tokens == nil && req.Local != nil {
		return req.PromptLen
	}
	return len(req.Tokens)
}

// scratch is per-call working memory, pooled so Route does not allocate it.
type scratch struct {
	matches []Match
	depth   [][kv.NumTiers]uint32 // per pool worker
	cand    []int                 // pool indices still eligible
	cost    []float64
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

func (r *Router) route(ctx context.Context, req Request, book bool) (*Decision, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	if req.Cost != nil {
		if err := req.Cost.validate(); err != nil {
			return nil, fmt.Errorf("router: request override: %w", err)
		}
	}
	t0 := time.Now()
	now := r.cfg.Now()
	role := req.Role.Norm()
	pk := poolKey{req.Model, role}

	r.mu.Lock()
	p := r.pools[pk]
	var bs int
	if p != nil {
		bs = p.blockSize
	}
	r.mu.Unlock()
	if p == nil {
		return nil, fmt.Errorf("%w for model %q role %s", kv.ErrNoWorkers, req.Model, role)
	}

	// Hash outside the lock. The decision owns these slices (the hint
	// planner, the worker and the load tracker read them later).
	isl := req.promptLen()
	if isl < 0 {
		return nil, fmt.Errorf("router: prompt length %d is negative", isl)
	}
	n := kv.NumFullBlocks(isl, bs)
	var local []kv.LocalHash
	var seq []kv.SeqHash
	switch {
	case req.Local != nil:
		if len(req.Local) != n {
			return nil, fmt.Errorf("router: %d precomputed local hashes for a prompt of %d tokens (%d full blocks of %d)", len(req.Local), isl, n, bs)
		}
		if n > 0 {
			local = req.Local
			seq = kv.SeqHashes(make([]kv.SeqHash, 0, n), local)
		}
	case n > 0:
		buf := make([]uint64, 2*n) // one allocation for both
		local = kv.LocalHashes(kv.AsHashes[kv.LocalHash](buf[:0:n]), req.Tokens, bs, kv.Seed(req.LoRA, req.Salt))
		seq = kv.SeqHashes(kv.AsHashes[kv.SeqHash](buf[n:n:2*n]), local)
	}
	t1 := time.Now()

	sc := r.scratch.Get().(*scratch)
	defer r.scratch.Put(sc)
	sc.matches = sc.matches[:0]
	if n > 0 {
		switch r.cfg.Mode {
		case ModeKV:
			sc.matches = r.cfg.Matcher.FindMatches(local, sc.matches)
			if r.blind.Load() > 0 {
				// Workers without KV events: what the router sent them.
				if e, ok := r.cfg.Approx.(approxExpirer); ok {
					e.Expire(now)
				}
				sc.matches = r.cfg.Approx.FindMatches(local, sc.matches)
			}
		case ModeKVApprox:
			if e, ok := r.cfg.Approx.(approxExpirer); ok {
				e.Expire(now)
			}
			sc.matches = r.cfg.Approx.FindMatches(local, sc.matches)
		}
		if !slices.IsSortedFunc(sc.matches, func(a, b Match) int { return cmpKey(a.Worker, b.Worker) }) {
			slices.SortFunc(sc.matches, func(a, b Match) int { return cmpKey(a.Worker, b.Worker) })
		}
	}
	t2 := time.Now()

	d := &Decision{r: r, Local: local, Seq: seq, ISL: isl, BlockSize: bs}
	var ev ReplicaEvent
	var emit bool

	r.mu.Lock()
	r.maybeSweep(now)
	p = r.pools[pk] // the pool may have changed while we hashed
	if p == nil || p.blockSize != bs {
		r.mu.Unlock()
		if p == nil {
			return nil, fmt.Errorf("%w for model %q role %s", kv.ErrNoWorkers, req.Model, role)
		}
		return nil, fmt.Errorf("router: model %q changed block size while routing; retry", req.Model)
	}
	req.Exclude = r.exclusions(req.Exclude, now)
	rr := p.rr
	chosen, err := r.choose(p, req, sc, seq, now)
	if !book {
		p.rr = rr // a peek does not advance round-robin
	}
	if err != nil {
		r.mu.Unlock()
		if book && errors.Is(err, kv.ErrAllBusy) {
			r.met.busy.Inc()
		}
		return nil, err
	}
	w := p.workers[chosen]
	d.Worker = w.info.Key
	predicted := r.cfg.Mode == ModeKVApprox || r.cfg.Mode == ModeKV && w.info.NoKVEvents
	d.Overlap = sc.depth[chosen]
	cachedBlocks := int(d.Overlap[kv.NumTiers-1])
	d.CachedTokens = min(cachedBlocks*bs, d.ISL)
	d.PrefillTokens = d.ISL - d.CachedTokens
	if req.NoPrefillCharge {
		d.PrefillTokens = 0
	}
	if !book {
		r.mu.Unlock()
		d.r = nil
		d.Timing = Timing{Hash: t1.Sub(t0), Match: t2.Sub(t1), Score: time.Since(t2), Total: time.Since(t0)}
		return d, nil
	}
	d.ID = r.cfg.RouterID + "-" + strconv.FormatUint(r.seq.Add(1), 36)
	a := &active{id: d.ID, load: w.load, prefill: int64(d.PrefillTokens), start: now}
	if !r.cfg.NoBlockTracking {
		a.seq, a.private = seq, int64(kv.BlocksNeeded(d.ISL, bs)-n)
	}
	w.load.add(a)
	r.active[d.ID] = a
	d.a = a
	var hint hintPlan
	hinted := false
	if r.engHashes != nil && !req.NoOverlapCredit {
		hint, hinted = planHint(p, chosen, sc.depth, len(seq), req.Exclude, r.cfg.HintPolicy)
	}
	if r.cfg.OnReplicaEvent != nil {
		ev = ReplicaEvent{Kind: ReplicaAdd, Router: r.cfg.RouterID, Decision: d.ID, Worker: d.Worker,
			PrefillTokens: a.prefill, PrivateBlocks: a.private, Blocks: a.seq}
		emit = true
	}
	r.mu.Unlock()

	if hinted {
		d.Hint = r.resolveHint(d.ID, hint, local)
	}
	if predicted && n > 0 {
		if si, ok := r.cfg.Approx.(approxSeqInserter); ok {
			si.InsertSeq(d.Worker, local, seq, now)
		} else {
			r.cfg.Approx.Insert(d.Worker, local, now)
		}
	}
	if emit {
		r.cfg.OnReplicaEvent(ev)
	}
	t3 := time.Now()
	d.Timing = Timing{Hash: t1.Sub(t0), Match: t2.Sub(t1), Score: t3.Sub(t2), Total: t3.Sub(t0)}
	r.met.observe(d, pathOf(&req))
	return d, nil
}

// choose returns the index in p.workers of the worker to use. Called with
// r.mu held.
func (r *Router) choose(p *pool, req Request, sc *scratch, seq []kv.SeqHash, now time.Time) (int, error) {
	nw := len(p.workers)
	sc.depth = slices.Grow(sc.depth[:0], nw)[:nw]
	sc.cand = sc.cand[:0]
	// Merge the sorted matches with the sorted pool.
	mi := 0
	excluded, noAdapter, decodeOnly := 0, 0, 0
	for i, w := range p.workers {
		for mi < len(sc.matches) && cmpKey(sc.matches[mi].Worker, w.info.Key) < 0 {
			mi++
		}
		if mi < len(sc.matches) && sc.matches[mi].Worker == w.info.Key && !req.NoOverlapCredit {
			// Clamp to the request and force the cumulative order, so a
			// misbehaving index cannot credit blocks the request lacks.
			var prev uint32
			for t, v := range sc.matches[mi].Depth {
				prev = max(prev, min(v, uint32(len(seq))))
				sc.depth[i][t] = prev
			}
		} else {
			sc.depth[i] = [kv.NumTiers]uint32{}
		}
		if req.LoRA != "" && !slices.Contains(w.info.LoRAs, req.LoRA) {
			// Neither a candidate nor, with no depth, a hint source.
			sc.depth[i] = [kv.NumTiers]uint32{}
			noAdapter++
			continue
		}
		if w.info.DecodeOnly && !req.NoPrefillCharge {
			// It cannot compute the prompt; it stays a hint source.
			decodeOnly++
			continue
		}
		if slices.Contains(req.Exclude, w.info.Key) {
			excluded++
			continue
		}
		if r.busy(w, now) {
			continue
		}
		sc.cand = append(sc.cand, i)
	}
	if len(sc.cand) == 0 {
		if noAdapter == nw {
			return 0, fmt.Errorf("%w for model %q with LoRA adapter %q", kv.ErrNoWorkers, req.Model, req.LoRA)
		}
		if decodeOnly > 0 && decodeOnly+noAdapter == nw {
			return 0, fmt.Errorf("%w for model %q: %w", kv.ErrNoWorkers, req.Model, ErrDecodeOnly)
		}
		if excluded+noAdapter+decodeOnly == nw {
			return 0, fmt.Errorf("%w for model %q: all %d excluded", kv.ErrNoWorkers, req.Model, nw)
		}
		return 0, &kv.BusyError{Model: req.Model, Workers: nw - excluded, RetryAfter: r.cfg.BusyRetryAfter}
	}
	rng := r.cfg.Rand
	switch r.cfg.Mode {
	case ModeRoundRobin:
		// Next candidate at or after the cursor, in key order.
		start := int(p.rr % uint64(nw))
		pick := sc.cand[0]
		for _, i := range sc.cand {
			if i >= start {
				pick = i
				break
			}
		}
		p.rr = uint64(pick + 1)
		return pick, nil
	case ModeRandom:
		return sc.cand[rng.IntN(len(sc.cand))], nil
	}

	cm := r.cfg.Cost
	if req.Cost != nil {
		cm = req.Cost
	}
	isl := float64(req.promptLen())
	charge := isl // prompt tokens charged as prefill
	if req.NoPrefillCharge {
		charge = 0
	}
	sc.cost = slices.Grow(sc.cost[:0], len(sc.cand))[:len(sc.cand)]
	cmin, cmax := math.Inf(1), math.Inf(-1)
	timed := cm.Kind == CostTime
	for j, i := range sc.cand {
		w := p.workers[i]
		var c float64
		if timed {
			in := costInput{depth: sc.depth[i], load: w.load, timing: w.info.Timing.orDefault(),
				budget: w.info.MaxBatchedTokens, kvCap: w.info.KVBlocks, blockSz: p.blockSize,
				usage: r.reportedUsage(w.load, now), noCharge: req.NoPrefillCharge, tierMS: w.info.TierLoad}
			if in.tierMS != (TierLoad{}) {
				in.backlogMS = w.load.backlogMS(now)
			}
			if in.budget <= 0 {
				in.budget = defaultPassBudget
			}
			c = cm.timeCost(&in, seq, isl)
		} else {
			c = cm.cost(sc.depth[i], w.load, seq, isl, charge, p.blockSize)
		}
		sc.cost[j] = c
		cmin, cmax = min(cmin, c), max(cmax, c)
	}
	if cm.Temperature == 0 || cmax == cmin {
		// Arg-min with a uniform reservoir pick among ties; with T > 0 and
		// equal costs the softmax is uniform, which is the same draw.
		var pick, ties int
		for j, c := range sc.cost {
			if c != cmin {
				continue
			}
			ties++
			if ties == 1 || rng.IntN(ties) == 0 {
				pick = sc.cand[j]
			}
		}
		return pick, nil
	}
	// Softmax over min–max normalised costs: p ∝ exp(−(c−min)/((max−min)·T)).
	scale := 1 / ((cmax - cmin) * cm.Temperature)
	var sum float64
	for j, c := range sc.cost {
		e := math.Exp(-(c - cmin) * scale)
		sc.cost[j] = e
		sum += e
	}
	u := rng.Float64() * sum
	for j, e := range sc.cost {
		u -= e
		if u < 0 {
			return sc.cand[j], nil
		}
	}
	return sc.cand[len(sc.cand)-1], nil
}

// cost is the DESIGN.md §5 cost of routing a request with isl tokens and
// prompt blocks seq to a worker with cumulative overlap depth and load l;
// charge is how many of the prompt's tokens count as prefill (isl, or 0
// for a decode leg whose KV arrives from elsewhere).
func (m *CostModel) cost(depth [kv.NumTiers]uint32, l *load, seq []kv.SeqHash, isl, charge float64, blockSize int) float64 {
	prefill := max((float64(l.prefillTokens)+charge)/float64(blockSize)-m.credit(depth), 0)
	// Decode blocks: what is active now plus what this request would add
	// (its blocks already active on the worker are shared, not new).
	reqBlocks := math.Ceil(isl / float64(blockSize))
	decode := float64(l.uniqueBlocks()) + reqBlocks - float64(l.activePrefix(seq))
	return m.PrefillScale*prefill + decode
}

// busy reports whether w is past a busy threshold. Called with r.mu held.
func (r *Router) busy(w *worker, now time.Time) bool {
	c := &r.cfg
	l := w.load
	if c.MaxPrefillTokens > 0 && l.prefillTokens > c.MaxPrefillTokens {
		return true
	}
	if c.MaxPrefillFrac > 0 && w.info.MaxBatchedTokens > 0 &&
		float64(l.prefillTokens) > c.MaxPrefillFrac*float64(w.info.MaxBatchedTokens) {
		return true
	}
	if c.MaxKVUsage > 0 && r.kvUsage(l, w.info.KVBlocks, now) > c.MaxKVUsage {
		return true
	}
	return false
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
	if a.load.idle() && !a.load.registered && r.loads[a.load.key] == a.load {
		delete(r.loads, a.load.key) // a replica-only entry with nothing left
	}
}
