// Package sim is kvmesh's simulated engine: a vLLM-v1-style scheduler
// (continuous batching, token budget, chunked prefill, LIFO preemption with
// recompute) over a paged KV pool with prefix caching, KV events and real
// per-block payload bytes, timed by Dynamo's mocker polynomial model.
//
// Core is the synchronous, goroutine-free scheduler the twin drives on a
// virtual clock; Engine wraps the same Core behind engine.Engine with a
// stepping goroutine on an injectable clock.
//
// It samples no distribution: Temperature, TopP and the penalties are ignored.
//
// It imports engine, kv, clock and internal helpers only: it does no network
// I/O (peers reach it through the worker's Fetcher and block views), so that
// the twin runs it unchanged on virtual time.
package sim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/kv"
)

// ErrNoSpace is returned by Insert when every block is referenced.
var ErrNoSpace = errors.New("no free or evictable KV block")

// Output is what one request produced in a pass: exactly one sampled token,
// and a finish reason when that token ended it.
type Output struct {
	Seq    *Seq
	Token  kv.Token
	First  bool            // the request's first token
	Finish kv.FinishReason // non-empty when the request finished
}

// StepResult describes one forward pass. It and its Outputs are reused by
// the next Step.
type StepResult struct {
	Start    time.Time
	Duration time.Duration // modelled: prefill + decode/DecodeSpeedupRatio + transfers
	End      time.Time     // Start + Duration; tokens are stamped with it

	Seqs          int // requests scheduled
	BatchedTokens int // tokens scheduled (≤ MaxBatchedTokens)
	PrefillTokens int // of which prompt (or recompute) tokens
	DecodeSeqs    int // requests that sampled a token
	ActiveKV      int // Σ context length of the sampling requests
	Preempted     int // requests preempted in this pass
	TransferBytes int64
	// Loading is the requests whose onboarding (Config.KVBM) is still in
	// flight after this pass; with Seqs == 0 the pass is a wait that ends
	// (End) when the first of them may run.
	Loading     int
	FirstTokens int // Outputs that are a request's first token
	Finished    int // Outputs that finish their request

	Outputs []Output
}

// Counters are a Core's running totals.
type Counters struct {
	Steps          uint64
	Added          uint64
	Finished       uint64
	Aborted        uint64
	Preemptions    uint64
	PromptTokens   uint64 // prompt tokens of admitted requests (first admission)
	CachedTokens   uint64 // of which found in the cache
	PrefillTokens  uint64 // prompt/recompute tokens computed
	OutputTokens   uint64
	StoredBlocks   uint64 // blocks freshly registered by computation
	InsertedBlocks uint64 // blocks committed by Insert
	EvictedBlocks  uint64
	FetchCalls     uint64
	FetchErrors    uint64
	FetchedBlocks  uint64
}

type schedEntry struct {
	s *Seq
	n int
}

// Core is the simulated engine's scheduler and KV pool. It is not safe for
// concurrent use and starts no goroutines; its driver passes the time.
type Core struct {
	cfg      Config
	bs       int
	totalKV  int
	wmBlocks int
	xferPer  int64
	pool     pool
	ev       eventLog
	waiting  seqDeque
	running  []*Seq
	sched    []schedEntry
	hitIDs   []int32
	scratch  []kv.Token
	res      StepResult
	counters Counters
	kb       *kbCore // block manager and connector (Config.KVBM), or nil
	refused  refusal
	shortcut uint64 // refusals made without matching the prefix (tests)
}

// refusal is admit's last refusal for want of blocks. Admit refuses the
// same request again, without matching its prefix, while the pool and the
// number of active requests are unchanged and its budget is no smaller
// (a smaller budget needs fewer blocks): a full pool retries its queue's
// head every pass, and matching a long prompt's whole prefix each time
// cost more than the rest of the scheduler.
type refusal struct {
	s                     *Seq
	version               uint64
	active, total, budget int
}

// NewCore builds a Core; zero sizes in cfg take the defaults.
func NewCore(cfg Config) (*Core, error) {
	cfg, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	c := &Core{cfg: cfg, bs: cfg.BlockSize, totalKV: cfg.Blocks * cfg.BlockSize,
		wmBlocks: int(cfg.Watermark * float64(cfg.Blocks)),
		scratch:  make([]kv.Token, 0, cfg.BlockSize)}
	c.xferPer = cfg.TransferBytesPerBlock
	if c.xferPer == 0 {
		c.xferPer = int64(cfg.Layers * cfg.PayloadSize)
	}
	c.ev = eventLog{worker: cfg.Worker, omitTokens: cfg.OmitEventTokens}
	c.pool = newPool(cfg.Blocks, cfg.Layers, cfg.PayloadSize, &c.ev)
	if cfg.StoreChecksums {
		c.pool.sums = make([]uint64, cfg.Blocks)
	}
	if cfg.KVBM != nil {
		if c.kb, err = newKB(c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Config returns the normalised configuration.
func (c *Core) Config() Config { return c.cfg }

// SetEventSink installs where KV events go (nil drops them). Events are
// numbered per sink from where the last one stopped.
func (c *Core) SetEventSink(sink engine.EventSink) {
	c.ev.sink, c.ev.transient = sink, false
	if c.kb != nil {
		c.kb.sinkInstalled()
	}
}

// SetTransientEventSink is SetEventSink for a sink that keeps neither the
// batch nor any slice in its events after it returns (it copies what it
// needs, as index.Index.Apply does): the core then reuses those slices for
// its next events instead of allocating new ones per flush.
func (c *Core) SetTransientEventSink(sink engine.EventSink) {
	c.ev.sink, c.ev.transient = sink, sink != nil
	if c.kb != nil {
		c.kb.sinkInstalled()
	}
}

// Counters returns the running totals.
func (c *Core) Counters() Counters {
	ct := c.counters
	ct.EvictedBlocks = c.pool.evicted
	return ct
}

// Idle reports whether no request is waiting or running.
func (c *Core) Idle() bool { return c.active() == 0 && c.waiting.len() == 0 }

// active is the admitted requests: running or onboarding.
func (c *Core) active() int {
	if c.kb != nil {
		return len(c.running) + len(c.kb.loadq)
	}
	return len(c.running)
}

// Stats is the load right now.
func (c *Core) Stats() engine.Stats {
	st := engine.Stats{Running: c.active(), Waiting: c.waiting.len(),
		UsedBlocks: c.pool.used, TotalBlocks: c.cfg.Blocks}
	for _, s := range c.running {
		if !s.decoding {
			st.PendingPrefillTokens += s.prefillEnd - s.computed
		}
	}
	if c.kb != nil {
		for _, s := range c.kb.loadq {
			st.PendingPrefillTokens += s.prefillEnd - s.computed
		}
	}
	for i := 0; i < c.waiting.len(); i++ {
		s := c.waiting.at(i)
		st.PendingPrefillTokens += s.total()
	}
	return st
}

// CachedBlocks returns the number of registered (prefix-cached) blocks.
func (c *Core) CachedBlocks() int { return c.pool.byHash.Len() }

// validate checks a request with a prompt of plen tokens against the
// engine's limits.
func (c *Core) validate(req *engine.Request, plen int) error {
	switch {
	case req == nil:
		return errors.New("sim: nil request")
	case plen <= 0:
		return fmt.Errorf("sim: request %q has an empty prompt", req.ID)
	case req.MaxTokens < 1:
		return fmt.Errorf("sim: request %q: max_tokens %d, want ≥ 1", req.ID, req.MaxTokens)
	}
	if need := kv.BlocksNeeded(plen+req.MaxTokens, c.bs); need > c.cfg.Blocks {
		return fmt.Errorf("sim: request %q: %d prompt + %d max tokens need %d KV blocks, the engine has %d",
			req.ID, plen, req.MaxTokens, need, c.cfg.Blocks)
	}
	return nil
}

// Prompt gives a prompt by its block hashes instead of all its tokens, so a
// trace replay need not materialise them: Len tokens, the local hashes of
// its Len/BlockSize full blocks (with the request's LoRA/salt seed), and the
// Len%BlockSize tokens after them. Stored events of its prompt blocks then
// carry no tokens.
type Prompt struct {
	Len   int
	Local []kv.LocalHash
	Tail  []kv.Token
	// Seq, optional, is kv.SeqHashes of Local, as a router decision
	// carries them: given, they are copied instead of chained again.
	Seq []kv.SeqHash
	// Prepaid: the blocks the Fetcher brings for this request were priced
	// before it arrived (a P/D handoff whose pull the caller models), so
	// its first pass is not charged for them a second time.
	Prepaid bool
}

// newSeq validates and hashes a request; it touches no Core state. Either
// tokens is the whole prompt (local optional), or tokens is nil and p
// describes it.
func (c *Core) newSeq(req *engine.Request, tokens []kv.Token, local []kv.LocalHash, p Prompt, now time.Time) (*Seq, error) {
	plen := p.Len
	if tokens != nil {
		plen = len(tokens)
	}
	if err := c.validate(req, plen); err != nil {
		return nil, err
	}
	seed := kv.Seed(req.LoRA, req.CacheSalt)
	nfull := kv.NumFullBlocks(plen, c.bs)
	capBlocks := kv.NumFullBlocks(plen+req.MaxTokens, c.bs)
	s := &Seq{req: req, promptLen: plen, prompt: tokens, seed: seed,
		out:   make([]kv.Token, 0, min(req.MaxTokens, 1024)),
		local: make([]kv.LocalHash, 0, capBlocks), seqh: make([]kv.SeqHash, 0, capBlocks),
		table: make([]int32, 0, kv.BlocksNeeded(plen+req.MaxTokens, c.bs))}
	switch {
	case tokens == nil:
		if len(p.Local) != nfull || len(p.Tail) != plen-nfull*c.bs {
			return nil, fmt.Errorf("sim: request %q: prompt of %d tokens given by %d local hashes and %d tail tokens, want %d and %d",
				req.ID, plen, len(p.Local), len(p.Tail), nfull, plen-nfull*c.bs)
		}
		if p.Seq != nil && len(p.Seq) != nfull {
			return nil, fmt.Errorf("sim: request %q: %d sequence hashes for %d local hashes", req.ID, len(p.Seq), nfull)
		}
		s.local = append(s.local, p.Local...)
		s.tail = p.Tail
		s.prepaid = p.Prepaid
	case local != nil:
		if len(local) != nfull {
			return nil, fmt.Errorf("sim: request %q: %d local hashes for %d full blocks", req.ID, len(local), nfull)
		}
		s.local = append(s.local, local...)
		s.tail = tokens[nfull*c.bs:]
	default:
		s.local = kv.LocalHashes(s.local, tokens, c.bs, seed)
		s.tail = tokens[nfull*c.bs:]
	}
	if tokens == nil && p.Seq != nil {
		s.seqh = append(s.seqh, p.Seq...)
	} else {
		s.seqh = kv.SeqHashes(s.seqh, s.local)
	}
	s.ctxTail = tailInit
	if nfull > 0 {
		s.ctxSeq = s.seqh[nfull-1]
	}
	for _, t := range s.tail {
		s.ctxTail = rollTail(s.ctxTail, t)
	}
	s.m.Arrival = now
	s.m.PromptTokens = plen
	return s, nil
}

// Add queues a request at time now, after offering its missing prefix to
// the configured Fetcher. The Core keeps req (and req.Tokens) until the
// request is done; do not modify them.
func (c *Core) Add(req *engine.Request, now time.Time) (*Seq, error) {
	if req == nil {
		return nil, errors.New("sim: nil request")
	}
	return c.add(c.newSeq(req, req.Tokens, nil, Prompt{}, now))
}

// AddHashed is Add with the prompt's local hashes already computed (one per
// full block, with the request's LoRA/salt seed), as the router has them.
func (c *Core) AddHashed(req *engine.Request, local []kv.LocalHash, now time.Time) (*Seq, error) {
	if req == nil {
		return nil, errors.New("sim: nil request")
	}
	return c.add(c.newSeq(req, req.Tokens, local, Prompt{}, now))
}

// AddPrompt is Add for a prompt given by hashes (req.Tokens is ignored).
func (c *Core) AddPrompt(req *engine.Request, p Prompt, now time.Time) (*Seq, error) {
	if req == nil {
		return nil, errors.New("sim: nil request")
	}
	return c.add(c.newSeq(req, nil, nil, p, now))
}

func (c *Core) add(s *Seq, err error) (*Seq, error) {
	if err != nil {
		return nil, err
	}
	if c.cfg.Fetcher != nil {
		if m := c.missing(s); len(m.Seq) > 0 {
			n, err := fetchInto(context.Background(), c.cfg.Fetcher, s.req, m, c)
			c.noteFetch(s, n, err)
		}
	}
	c.enqueue(s)
	return s, nil
}

// missing is the part of s's full prompt blocks not cached here.
func (c *Core) missing(s *Seq) Missing {
	n, _ := c.pool.match(s.seqh, nil)
	m := Missing{Start: n, Local: s.local[n:len(s.local):len(s.local)], Seq: s.seqh[n:len(s.seqh):len(s.seqh)]}
	if n > 0 {
		m.HasParent, m.Parent = true, s.seqh[n-1]
	}
	return m
}

// countingInserter counts the blocks a fetcher commits.
type countingInserter struct {
	into Inserter
	n    int
}

func (ci *countingInserter) Insert(ch Chain) (int, error) {
	n, err := ci.into.Insert(ch)
	ci.n += n
	return n, err
}

func fetchInto(ctx context.Context, f Fetcher, req *engine.Request, m Missing, into Inserter) (int, error) {
	ci := &countingInserter{into: into}
	err := f(ctx, req, m, ci)
	return min(ci.n, len(m.Seq)), err
}

func (c *Core) noteFetch(s *Seq, blocks int, err error) {
	c.counters.FetchCalls++
	if err != nil {
		c.counters.FetchErrors++
	}
	c.counters.FetchedBlocks += uint64(blocks)
	s.m.FetchedTokens = blocks * c.bs
	if !s.prepaid {
		s.pendingXfer = int64(blocks) * c.xferPer
	}
}

func (c *Core) enqueue(s *Seq) {
	s.st = stWaiting
	c.waiting.pushBack(s)
	c.counters.Added++
}

// Abort removes a request, freeing its blocks. It reports false if the
// request was already done.
func (c *Core) Abort(s *Seq, now time.Time) bool {
	if s == nil || s.st == stFinished {
		return false
	}
	switch s.st {
	case stRunning:
		for i, r := range c.running {
			if r == s {
				c.running = append(c.running[:i], c.running[i+1:]...)
				break
			}
		}
	case stLoading:
		c.kb.unload(s)
	default:
		c.waiting.remove(s)
	}
	c.freeBlocks(s)
	if c.kb != nil {
		c.kb.finished(s)
	}
	s.st = stFinished
	s.m.Finish = kv.FinishCancelled
	s.m.Finished = now
	c.counters.Aborted++
	c.ev.flush()
	return true
}

// freeBlocks releases a request's blocks tail first, so its last blocks are
// evicted before its first ones (as vLLM does).
func (c *Core) freeBlocks(s *Seq) {
	for i := len(s.table) - 1; i >= 0; i-- {
		c.pool.release(s.table[i])
	}
	s.table = s.table[:0]
	s.nReg = 0
	s.computed = 0
}

// Step runs one forward pass starting at now: it schedules running requests
// first (chunked prefill or one decode token each), preempting the most
// recently admitted ones when blocks run out, then admits waiting requests
// (prefix-cache hits first) while the token budget and sequence limit allow.
// Every request whose known tokens are all computed samples one token,
// stamped at the pass end.
func (c *Core) Step(now time.Time) *StepResult {
	r := &c.res
	// Field by field: a whole-struct store costs a write-barrier copy of
	// Outputs on every pass.
	r.Start, r.End, r.Duration = now, now, 0
	r.Seqs, r.BatchedTokens, r.PrefillTokens, r.DecodeSeqs, r.ActiveKV, r.Preempted = 0, 0, 0, 0, 0, 0
	r.TransferBytes, r.FirstTokens, r.Finished, r.Loading = 0, 0, 0, 0
	r.Outputs = r.Outputs[:0]
	c.sched = c.sched[:0]
	budget := c.cfg.MaxBatchedTokens
	if c.kb != nil {
		c.kb.promote(now) // onboarded requests run from this pass on
		if c.kb.ready != nil {
			c.kb.mgr.Settle() // object writes done since the last pass
		}
	}

	for i := 0; i < len(c.running) && budget > 0; i++ {
		s := c.running[i]
		n := min(s.total()-s.computed, budget)
		ok := c.grow(s, n)
		for !ok {
			v := c.running[len(c.running)-1]
			c.running = c.running[:len(c.running)-1]
			c.preempt(v)
			r.Preempted++
			if v == s {
				break
			}
			ok = c.grow(s, n)
		}
		if !ok {
			break
		}
		c.sched = append(c.sched, schedEntry{s, n})
		budget -= n
	}
	if r.Preempted == 0 {
		for budget > 0 && c.waiting.len() > 0 && c.active() < c.cfg.MaxSeqs {
			s := c.waiting.front()
			n, ok := c.admit(s, budget)
			if !ok {
				break
			}
			c.waiting.popFront()
			if s.m.Scheduled.IsZero() {
				s.m.Scheduled = now
			}
			if s.st == stLoading {
				continue // runs once its blocks are onboarded
			}
			s.st = stRunning
			c.running = append(c.running, s)
			c.sched = append(c.sched, schedEntry{s, n})
			budget -= n
		}
	}

	// Price the pass.
	for _, e := range c.sched {
		s := e.s
		r.BatchedTokens += e.n
		if !s.decoding {
			r.PrefillTokens += e.n
		}
		if s.computed+e.n == s.total() {
			r.DecodeSeqs++
			r.ActiveKV += s.total()
		}
		r.TransferBytes += s.pendingXfer
		s.pendingXfer = 0
	}
	r.Seqs = len(c.sched)
	if c.kb != nil {
		// Loads start before the forward pass and overlap it.
		c.kb.bind(c.sched, now)
		r.Loading = len(c.kb.loadq)
		if r.Seqs == 0 && r.Loading > 0 {
			// Only onboarding in flight: wait for the first to land.
			if d := c.kb.loadq[0].kb.ready.Sub(now); d > 0 {
				r.Duration, r.End = d, now.Add(d)
			}
			c.counters.Preemptions += uint64(r.Preempted)
			c.ev.flush()
			return r
		}
	}
	ms := c.cfg.Timing.PrefillMS(r.PrefillTokens) + TransferMS(r.TransferBytes, c.cfg.TransferBandwidth)
	if r.DecodeSeqs > 0 {
		ms += c.cfg.Timing.DecodeMS(r.ActiveKV, c.totalKV) / c.cfg.DecodeSpeedupRatio
	}
	r.Duration = msToDuration(ms)
	r.End = now.Add(r.Duration)
	if c.kb != nil {
		c.kb.saved() // the pass's completed blocks go to the tiers
	}

	// Apply it: advance computed tokens and sample.
	finished := 0
	for _, e := range c.sched {
		s := e.s
		s.computed += e.n
		if s.computed == s.total() {
			if c.sample(s, r.End) {
				finished++
			}
		}
	}
	if finished > 0 {
		k := 0
		for _, s := range c.running {
			if s.st != stFinished {
				c.running[k] = s
				k++
			}
		}
		clear(c.running[k:])
		c.running = c.running[:k]
	}
	c.counters.Steps++
	c.counters.PrefillTokens += uint64(r.PrefillTokens)
	c.counters.Preemptions += uint64(r.Preempted)
	c.ev.flush()
	return r
}

// grow gives s the blocks for n more tokens and registers the blocks that
// become full; false (and no change) when the pool cannot supply them.
func (c *Core) grow(s *Seq, n int) bool {
	need := kv.BlocksNeeded(s.computed+n, c.bs) - len(s.table)
	if need > c.pool.available() {
		return false
	}
	c.allocN(s, need)
	c.register(s, s.computed+n)
	return true
}

func (c *Core) allocN(s *Seq, need int) {
	c.pool.warmEvict(need)
	for ; need > 0; need-- {
		id, _ := c.pool.alloc()
		s.table = append(s.table, id)
	}
}

// cannotAdmit reports that admit must refuse s for want of blocks, whatever
// its prefix hits, when one lookup shows it (see refusal for why). With h
// hits admit needs min(N−h, B) blocks (N for the whole prompt, B for a
// budget-sized chunk) and has at most avail; when B > avail that takes
// h ≥ N−avail, i.e. block N−avail−1 cached among the leading hits.
func (c *Core) cannotAdmit(s *Seq, total, maxHit, budget int) bool {
	avail := c.pool.available()
	if c.active() > 0 {
		avail -= c.wmBlocks
	}
	if kv.BlocksNeeded(budget, c.bs) <= avail {
		return false
	}
	k := kv.BlocksNeeded(total, c.bs) - avail // the hits it takes
	if k <= 0 {
		return false
	}
	if k > maxHit {
		return true
	}
	_, ok := c.pool.byHash.Get(s.seqh[k-1])
	return !ok
}

// admit tries to start waiting request s with at most budget tokens:
// cached prefix blocks are reused (at least one token is always computed),
// the rest of the first chunk gets fresh blocks, keeping the watermark free
// unless nothing is running.
func (c *Core) admit(s *Seq, budget int) (int, bool) {
	total := s.total()
	maxHit := min((total-1)/c.bs, len(s.seqh))
	if c.kb == nil && !c.cfg.FullAdmitMatch {
		// Without a connector a refusal depends on nothing else.
		if r := &c.refused; r.s == s && r.version == c.pool.version && r.active == c.active() && r.total == total && budget >= r.budget ||
			c.cannotAdmit(s, total, maxHit, budget) {
			c.shortcut++
			return 0, false
		}
	}
	var hits int
	hits, c.hitIDs = c.pool.match(s.seqh[:maxHit], c.hitIDs[:0])
	computed := hits * c.bs
	ext := 0
	if c.kb != nil {
		ext = c.kb.match(s, computed)
	}
	n := min(total-computed-ext, budget)
	if ext > 0 {
		// Onboarding first: the first chunk's blocks come when it runs.
		n = 0
	}
	need := kv.BlocksNeeded(computed+ext+n, c.bs) - hits
	avail := c.pool.available()
	for _, id := range c.hitIDs {
		if c.pool.blocks[id].ref == 0 {
			avail-- // reusing it takes it off the evictable list
		}
	}
	if c.active() > 0 {
		avail -= c.wmBlocks
	}
	if need > avail {
		c.refused = refusal{s: s, version: c.pool.version, active: c.active(), total: total, budget: budget}
		return 0, false
	}
	for _, id := range c.hitIDs {
		c.pool.acquire(id)
	}
	s.table = append(s.table, c.hitIDs...)
	s.nReg, s.computed, s.prefillEnd = hits, computed+ext, total
	if !s.admitted {
		s.admitted = true
		s.m.CachedTokens, s.m.ExternalTokens = computed+ext, ext
		c.counters.PromptTokens += uint64(s.promptLen)
		c.counters.CachedTokens += uint64(computed + ext)
	}
	c.allocN(s, need)
	c.register(s, computed+ext+n)
	if c.kb != nil {
		c.kb.allocated(s, computed+ext, ext)
	}
	return n, true
}

// register makes s's full blocks up to token upto findable. A block another
// request registered meanwhile is shared instead (its duplicate is freed, no
// event); a fresh one is stored (its payload filled on first read) and a
// Stored event emitted.
func (c *Core) register(s *Seq, upto int) {
	full := upto / c.bs
	if full-s.nReg > 1 {
		c.pool.warm(s.seqh[s.nReg:full])
	}
	for b := s.nReg; b < full; b++ {
		h := s.seqh[b]
		id := s.table[b]
		if other, ok := c.pool.byHash.Get(h); ok {
			if c.kb != nil {
				// The connector holds this block's id: keep computing
				// into it, unfindable (as vLLM keeps a duplicate).
				c.pool.shadow(id, h)
				continue
			}
			c.pool.acquire(other)
			c.pool.release(id)
			s.table[b] = other
			continue
		}
		var parent kv.SeqHash
		if b > 0 {
			parent = s.seqh[b-1]
		}
		c.pool.register(id, h, s.local[b], parent, b > 0, true)
		c.pool.domains[id] = s.seed
		c.counters.StoredBlocks++
		var toks []kv.Token
		if c.ev.sink != nil && !c.ev.omitTokens {
			toks = s.blockTokens(b, c.bs, c.scratch)
		}
		c.ev.stored(kv.EngineHash(parent), b > 0, kv.EngineHash(h), s.local[b], toks, s.req.LoRA, s.req.CacheSalt)
	}
	if full > s.nReg {
		s.nReg = full
	}
}

func (c *Core) preempt(s *Seq) {
	c.freeBlocks(s)
	s.decoding = false
	s.st = stWaiting
	s.m.Preemptions++
	c.waiting.pushFront(s)
}

// sample appends s's next token, hashing a block it completes, and reports
// whether s finished.
func (c *Core) sample(s *Seq, end time.Time) bool {
	var tok kv.Token
	if out := c.cfg.OutputTokens; len(out) > 0 {
		tok = out[NextToken(s.req.Seed, s.ctxSeq, s.ctxTail, uint32(len(out)))]
	} else {
		tok = NextToken(s.req.Seed, s.ctxSeq, s.ctxTail, uint32(c.cfg.VocabSize))
	}
	s.out = append(s.out, tok)
	s.ctxTail = rollTail(s.ctxTail, tok)
	if t := s.total(); t%c.bs == 0 {
		b := t/c.bs - 1
		l := kv.HashTokens(s.blockTokens(b, c.bs, c.scratch), s.seed)
		h := kv.SeqHash(l) // a first block's sequence hash is its local hash
		if b > 0 {
			h = kv.ChainHash(s.seqh[b-1], l)
		}
		s.local = append(s.local, l)
		s.seqh = append(s.seqh, h)
		s.ctxSeq, s.ctxTail = h, tailInit
	}
	s.decoding = true
	first := len(s.out) == 1
	if first {
		s.m.FirstToken = end
	}
	s.m.OutputTokens = len(s.out)
	c.counters.OutputTokens++
	var fin kv.FinishReason
	if !s.req.IgnoreEOS && len(s.out) >= s.req.MinTokens {
		for _, st := range s.req.StopTokens {
			if st == tok {
				fin = kv.FinishStop
				break
			}
		}
	}
	if fin == kv.FinishNone && len(s.out) >= s.req.MaxTokens {
		fin = kv.FinishLength
	}
	c.res.Outputs = append(c.res.Outputs, Output{Seq: s, Token: tok, First: first, Finish: fin})
	if first {
		c.res.FirstTokens++
	}
	if fin == kv.FinishNone {
		return false
	}
	c.res.Finished++
	c.freeBlocks(s)
	if c.kb != nil {
		c.kb.finished(s)
	}
	s.st = stFinished
	s.m.Finish = fin
	s.m.Finished = end
	c.counters.Finished++
	return true
}

func (c *Counters) add(o Counters) {
	c.Steps += o.Steps
	c.Added += o.Added
	c.Finished += o.Finished
	c.Aborted += o.Aborted
	c.Preemptions += o.Preemptions
	c.PromptTokens += o.PromptTokens
	c.CachedTokens += o.CachedTokens
	c.PrefillTokens += o.PrefillTokens
	c.OutputTokens += o.OutputTokens
	c.StoredBlocks += o.StoredBlocks
	c.InsertedBlocks += o.InsertedBlocks
	c.EvictedBlocks += o.EvictedBlocks
	c.FetchCalls += o.FetchCalls
	c.FetchErrors += o.FetchErrors
	c.FetchedBlocks += o.FetchedBlocks
}
