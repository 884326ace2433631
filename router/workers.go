package router

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// WorkerInfo is what discovery says about one worker key (instance + DP
// rank). The router routes each request among the workers of its model and
// role.
type WorkerInfo struct {
	Key              kv.WorkerKey
	Model            string
	Role             kv.Role
	BlockSize        int    // tokens per KV block; equal across a model's pool
	KVBlocks         int    // device KV capacity in blocks (0: unknown)
	MaxBatchedTokens int    // engine's max batched tokens (0: unknown)
	Digest           string // compatibility digest (layout); hints need equal digests
	ControlEndpoint  string // where this rank serves its blocks to peers ("" if none)
	HintCapable      bool   // the worker accepts kv.fetch hints
	// DecodeOnly: a decode worker whose engine cannot prefill alone
	// (SGLang's decode servers). Only disaggregated decode legs
	// (Request.NoPrefillCharge) go to it, never a whole request.
	DecodeOnly bool
	// LoRAs are the adapters the worker serves; a request naming one
	// (Request.LoRA) goes only to workers that list it.
	LoRAs []string
	// Timing is the worker's forward-pass timing model, read by the time
	// cost (CostTime); zero means DefaultEngineTiming (engine/sim's).
	Timing EngineTiming
	// TierLoad is the worker's per-block onboarding time per tier, read
	// by the time cost; zero (unknown) keeps the fixed tier credits.
	TierLoad TierLoad
	// NoKVEvents: the worker's engine publishes no KV events (a real
	// engine started without an event source), so the event index never
	// sees its cache. In kv mode its overlap comes from the approximate
	// index of its own routing history, as in kv-approx mode, instead of
	// reading as always cold.
	NoKVEvents bool
}

type poolKey struct {
	model string
	role  kv.Role
}

// pool is the live workers of one model and role, sorted by key so a merge
// with the index's (sorted) matches is linear.
type pool struct {
	blockSize int
	workers   []*worker
	// slots[i] is workers[i]'s hot state, dense: a decision at thousands of
	// workers reads it for every one of them, and chasing each worker's
	// pointer to its WorkerInfo was most of a decision's time.
	slots      []slot
	decodeOnly int    // workers with DecodeOnly set
	rr         uint64 // round-robin cursor
}

// slot is what a decision reads of every worker of a pool, derived from
// its WorkerInfo when it is added or updated.
type slot struct {
	key    kv.WorkerKey
	load   *load
	w      *worker
	timing *EngineTiming // Timing.orDefault(), in w
	budget int           // tokens per pass: MaxBatchedTokens, or defaultPassBudget
	kvCap  int           // KVBlocks
	// loras: the worker lists adapters (the base model needs no check);
	// tiers: it has a TierLoad.
	loras, tiers, decodeOnly bool
}

func slotOf(w *worker) slot {
	w.timing = w.info.Timing.orDefault()
	budget := w.info.MaxBatchedTokens
	if budget <= 0 {
		budget = defaultPassBudget
	}
	return slot{key: w.info.Key, load: w.load, w: w, timing: &w.timing, budget: budget, kvCap: w.info.KVBlocks,
		loras: len(w.info.LoRAs) > 0, tiers: w.info.TierLoad != (TierLoad{}), decodeOnly: w.info.DecodeOnly}
}

// resync rebuilds the pool's slots from its workers (they changed).
func (p *pool) resync() {
	p.slots = slices.Grow(p.slots[:0], len(p.workers))[:len(p.workers)]
	p.decodeOnly = 0
	for i, w := range p.workers {
		p.slots[i] = slotOf(w)
		if w.info.DecodeOnly {
			p.decodeOnly++
		}
	}
}

type worker struct {
	info   WorkerInfo
	load   *load
	timing EngineTiming // info.Timing.orDefault(), for slot.timing
}

// load is the router's view of one worker key's activity. It outlives the
// worker while replica messages refer to it and is detached (no longer in
// Router.loads) when the worker is removed, so late frees are harmless.
type load struct {
	key           kv.WorkerKey
	prefillTokens int64    // tokens still to prefill, over active requests
	refs          blockSet // active prompt blocks, refcounted across requests
	// solo is the one request in flight while no other is (booked by this
	// router): its blocks are read from its own sequence and go into refs
	// only when a second request comes. A worker at light load holds one
	// request or none, and booking and freeing a long prompt's blocks one
	// by one is most of a decision's cost that grows with the prompt.
	solo       *active
	private    int64 // blocks no other request can share (partial tails)
	requests   int64
	registered bool

	// Last load report from the worker.
	repUsed, repTotal, repRunning, repWaiting int64
	repAt                                     time.Time
	hasRep                                    bool
	// Onboarding backlog of the last report (UpdateOnboarding).
	repBacklog   time.Duration
	repBacklogAt time.Time
	// residencyMS is a moving average of how long requests stay on the
	// worker, routed to done (0 until one is done).
	residencyMS float64
}

// residencyAlpha weighs each finished request in load.residencyMS.
const residencyAlpha = 1.0 / 32

func (l *load) observeResidency(d time.Duration) {
	ms := max(float64(d)/float64(time.Millisecond), 0)
	if l.residencyMS == 0 {
		l.residencyMS = ms
		return
	}
	l.residencyMS += residencyAlpha * (ms - l.residencyMS)
}

func (l *load) uniqueBlocks() int64 {
	if l.solo != nil {
		return int64(len(l.solo.seq)) + l.private
	}
	return int64(l.refs.len()) + l.private
}

// activePrefix is how many leading blocks of seq are already active on l.
// Active sets are unions of whole request prefixes, and a sequence hash
// names its entire prefix, so membership is monotone along seq and a binary
// search is exact; for the same reason a block of seq is in the solo
// request's prefix exactly when the solo sequence holds it at the same
// position.
func (l *load) activePrefix(seq []kv.SeqHash) int {
	if l.solo != nil {
		solo := l.solo.seq
		return sort.Search(min(len(seq), len(solo)), func(i int) bool { return seq[i] != solo[i] })
	}
	if l.refs.len() == 0 || len(seq) == 0 {
		return 0
	}
	lo, hi := 0, len(seq) // invariant: seq[:lo] active, seq[hi:] not
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if l.refs.has(seq[m]) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// add books a on l. own: a's sequence was hashed by this router, so its
// blocks are distinct and a may be the solo request (a replica's sequence
// is counted block by block, whatever it holds).
func (l *load) add(a *active, own bool) {
	l.prefillTokens += a.prefill
	l.private += a.private
	l.requests++
	if own && l.requests == 1 && l.solo == nil && l.refs.len() == 0 {
		l.solo = a
		return
	}
	if l.solo != nil {
		l.book(l.solo.seq)
		l.solo = nil
	}
	l.book(a.seq)
}

// book adds one reference to each block of seq.
func (l *load) book(seq []kv.SeqHash) {
	l.refs.warm(seq)
	for _, h := range seq {
		l.refs.inc(h)
	}
}

func (l *load) prefillDone(a *active) {
	l.prefillTokens -= a.prefill
	a.prefill = 0
}

func (l *load) free(a *active) {
	l.prefillTokens -= a.prefill
	a.prefill = 0
	l.private -= a.private
	l.requests--
	if l.solo == a {
		l.solo = nil
		return
	}
	l.refs.warm(a.seq)
	for _, h := range a.seq {
		l.refs.dec(h)
	}
}

func (l *load) idle() bool { return l.requests == 0 }

// validate checks what a worker registers on its own, before it meets
// its pool.
func (info *WorkerInfo) validate() error {
	if info.Model == "" {
		return fmt.Errorf("router: worker %v: empty model", info.Key)
	}
	if info.BlockSize <= 0 {
		return fmt.Errorf("router: worker %v: block size %d must be positive", info.Key, info.BlockSize)
	}
	if info.KVBlocks < 0 || info.MaxBatchedTokens < 0 {
		return fmt.Errorf("router: worker %v: negative capacity", info.Key)
	}
	if err := info.Timing.validate(); err != nil {
		return fmt.Errorf("router: worker %v: %w", info.Key, err)
	}
	if err := info.TierLoad.validate(); err != nil {
		return fmt.Errorf("router: worker %v: %w", info.Key, err)
	}
	return nil
}

// AddWorker adds or updates a worker key. A key moves pools when its model
// or role changes; its load view is kept. Adding a key that was not
// registered lifts its inhibition; updating a registered one does not.
func (r *Router) AddWorker(info WorkerInfo) error {
	if err := info.validate(); err != nil {
		return err
	}
	info.Role = info.Role.Norm()
	pk := poolKey{info.Model, info.Role}

	r.mu.Lock()
	defer r.mu.Unlock()
	r.chg.Add(1) // conservative: even a failed or unchanged update counts
	p := r.pools[pk]
	if p != nil && len(p.workers) > 0 && p.blockSize != info.BlockSize {
		if !(len(p.workers) == 1 && p.workers[0].info.Key == info.Key) {
			return fmt.Errorf("router: worker %v: block size %d differs from model %q's %d",
				info.Key, info.BlockSize, info.Model, p.blockSize)
		}
	}
	if w := r.workers[info.Key]; w != nil {
		old := poolKey{w.info.Model, w.info.Role}
		r.blind.Add(-int64(b2i(w.info.NoKVEvents))) // the new info counts below
		if old != pk {
			r.dropFromPool(old, info.Key)
		} else {
			w.info = info
			p.blockSize = info.BlockSize
			i, _ := slices.BinarySearchFunc(p.workers, info.Key, func(x *worker, k kv.WorkerKey) int { return cmpKey(x.info.Key, k) })
			p.decodeOnly += b2i(info.DecodeOnly) - b2i(p.slots[i].decodeOnly)
			p.slots[i] = slotOf(w)
			r.blind.Add(int64(b2i(info.NoKVEvents)))
			return nil
		}
	}
	l := r.loads[info.Key]
	if l == nil {
		l = &load{key: info.Key}
		r.loads[info.Key] = l
	}
	l.registered = true
	// A fresh registration (discovery dropped the key and it came back: a
	// restarted or unfrozen worker, or every record expiring at once when
	// NATS restarts) is newer evidence than the failure that inhibited it.
	delete(r.inhibited, info.Key)
	w := &worker{info: info, load: l}
	r.workers[info.Key] = w
	if p == nil {
		p = &pool{}
		r.pools[pk] = p
	}
	p.blockSize = info.BlockSize
	i, _ := slices.BinarySearchFunc(p.workers, info.Key, func(x *worker, k kv.WorkerKey) int { return cmpKey(x.info.Key, k) })
	p.workers = slices.Insert(p.workers, i, w)
	p.slots = slices.Insert(p.slots, i, slotOf(w))
	p.decodeOnly += b2i(info.DecodeOnly)
	r.nworkers.Store(int64(len(r.workers)))
	r.blind.Add(int64(b2i(info.NoKVEvents)))
	return nil
}

// RemoveWorker forgets a worker key: it is never chosen again and its load
// view is dropped (decisions still open on it free nothing when they end).
// Removing an unknown key is a no-op.
func (r *Router) RemoveWorker(key kv.WorkerKey) {
	if rm, ok := r.cfg.Approx.(approxRemover); ok {
		rm.RemoveWorker(key) // its predicted holdings leave with it
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.workers[key]
	if w == nil {
		return
	}
	r.dropFromPool(poolKey{w.info.Model, w.info.Role}, key)
	delete(r.workers, key)
	if r.loads[key] == w.load {
		delete(r.loads, key)
	}
	w.load.registered = false
	r.chg.Add(1)
	r.nworkers.Store(int64(len(r.workers)))
	r.blind.Add(-int64(b2i(w.info.NoKVEvents)))
}

func (r *Router) dropFromPool(pk poolKey, key kv.WorkerKey) {
	p := r.pools[pk]
	if p == nil {
		return
	}
	p.workers = slices.DeleteFunc(p.workers, func(w *worker) bool { return w.info.Key == key })
	if len(p.workers) == 0 {
		delete(r.pools, pk)
	}
	p.resync()
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Workers returns the live workers of a model and role, in key order.
func (r *Router) Workers(model string, role kv.Role) []WorkerInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.pools[poolKey{model, role.Norm()}]
	if p == nil {
		return nil
	}
	out := make([]WorkerInfo, len(p.workers))
	for i, w := range p.workers {
		out[i] = w.info
	}
	return out
}

// UpdateLoad records a worker's own load report: KV blocks used of total,
// running and waiting requests. Reports older than Config.LoadReportTTL
// stop counting. Unknown keys are ignored.
func (r *Router) UpdateLoad(key kv.WorkerKey, used, total, running, waiting int) {
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.workers[key]
	if w == nil {
		return
	}
	l := w.load
	l.repUsed, l.repTotal, l.repRunning, l.repWaiting = int64(used), int64(total), int64(running), int64(waiting)
	l.repAt, l.hasRep = now, true
	r.chg.Add(1)
}

// UpdateOnboarding records how long a worker's onboarding channel (tier →
// device loads) stays busy with what it has queued, as of now. The time
// cost reads it, drained by the time passed since, when it prices a tier
// load there. Unknown keys are ignored; a negative backlog is 0.
func (r *Router) UpdateOnboarding(key kv.WorkerKey, backlog time.Duration) {
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if w := r.workers[key]; w != nil {
		w.load.repBacklog, w.load.repBacklogAt = max(backlog, 0), now
		r.chg.Add(1)
	}
}

// backlogMS is what remains now of the worker's last reported onboarding
// backlog, in ms.
func (l *load) backlogMS(now time.Time) float64 {
	rest := l.repBacklog - now.Sub(l.repBacklogAt)
	if rest <= 0 {
		return 0
	}
	return float64(rest) / float64(time.Millisecond)
}

// WorkerLoad is the router's load view of one worker key.
type WorkerLoad struct {
	Key                 kv.WorkerKey
	ActivePrefillTokens int64
	ActiveBlocks        int64 // unique active blocks
	ActiveRequests      int64
	KVUsage             float64 // fraction used: max(report, own estimate)
}

// Load returns the router's load view of a worker key (zero if unknown).
func (r *Router) Load(key kv.WorkerKey) WorkerLoad {
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.loads[key]
	if l == nil {
		return WorkerLoad{Key: key}
	}
	var capacity int
	if w := r.workers[key]; w != nil {
		capacity = w.info.KVBlocks
	}
	return WorkerLoad{
		Key:                 key,
		ActivePrefillTokens: l.prefillTokens,
		ActiveBlocks:        l.uniqueBlocks(),
		ActiveRequests:      l.requests,
		KVUsage:             r.kvUsage(l, capacity, now),
	}
}

// Loads returns the load view of every worker key the router knows of
// (registered or referred to by replica messages), in key order.
func (r *Router) Loads() []WorkerLoad {
	r.mu.Lock()
	keys := make([]kv.WorkerKey, 0, len(r.loads))
	for k := range r.loads {
		keys = append(keys, k)
	}
	r.mu.Unlock()
	slices.SortFunc(keys, cmpKey)
	out := make([]WorkerLoad, 0, len(keys))
	for _, k := range keys {
		out = append(out, r.Load(k))
	}
	return out
}

func (r *Router) kvUsage(l *load, capacity int, now time.Time) float64 {
	var u float64
	if capacity > 0 {
		u = float64(l.uniqueBlocks()) / float64(capacity)
	}
	return max(u, r.reportedUsage(l, now))
}

// reportedUsage is the KV usage fraction of the worker's last report, or 0
// when there is none or it is older than LoadReportTTL.
func (r *Router) reportedUsage(l *load, now time.Time) float64 {
	if l.hasRep && l.repTotal > 0 && now.Sub(l.repAt) <= r.cfg.LoadReportTTL {
		return float64(l.repUsed) / float64(l.repTotal)
	}
	return 0
}

// freshReport is the worker's last reported running and waiting requests,
// while the report is younger than LoadReportTTL.
func (r *Router) freshReport(l *load, now time.Time) report {
	if !l.hasRep || now.Sub(l.repAt) > r.cfg.LoadReportTTL {
		return report{}
	}
	return report{running: l.repRunning, waiting: l.repWaiting, ok: true}
}

func cmpKey(a, b kv.WorkerKey) int {
	switch {
	case a.Instance < b.Instance:
		return -1
	case a.Instance > b.Instance:
		return 1
	case a.DPRank < b.DPRank:
		return -1
	case a.DPRank > b.DPRank:
		return 1
	}
	return 0
}
