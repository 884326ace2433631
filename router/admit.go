package router

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// AdmitConfig is the admission stage (Config.Admit): a worker is a
// candidate only while its engine can take the request without queueing
// it behind a full KV cache or a long prefill backlog. Every threshold is
// relative to the worker's own capacity (WorkerInfo.KVBlocks,
// MaxBatchedTokens) or load, so one setting fits a mixed fleet. A
// negative value turns its check off; zero picks the default.
//
// A worker with nothing booked and nothing reported running or waiting
// admits anything, so a request larger than every threshold still runs
// (the engine itself refuses what it can never hold).
type AdmitConfig struct {
	// KVUsage: the worker admits while the KV blocks in use (the larger
	// of its last report and the router's own count of active blocks)
	// plus the request's blocks not already active there stay within
	// this fraction of its capacity; the rest is headroom for the running
	// requests' decodes, which would otherwise preempt each other.
	// Default DefaultAdmitKVUsage; workers of unknown capacity pass.
	KVUsage float64
	// PrefillPasses: the worker admits while the prefill the router has
	// booked on it and not yet seen a first token for is under this many
	// of its passes (MaxBatchedTokens, or the router's default budget when
	// unknown). Default DefaultAdmitPrefillPasses.
	PrefillPasses float64
	// Waiting: the worker admits while its last fresh report shows at
	// most this many waiting requests per running one (the engine's own
	// queue: it already holds more than it can schedule). Default
	// DefaultAdmitWaiting.
	Waiting float64
	// WaitWeight (cost modes) weighs a worker's predicted wait for
	// admission in its price, so a request goes to where its own work is
	// least and waits for that worker when the wait costs less than the
	// recompute elsewhere. Default DefaultAdmitWaitWeight; negative: 0.
	WaitWeight float64
}

// Admission defaults: what the twin's ladder chose (docs/benchmarks.md,
// "The router queue").
const (
	DefaultAdmitKVUsage       = 0.97
	DefaultAdmitPrefillPasses = 2
	DefaultAdmitWaiting       = 1
	DefaultAdmitWaitWeight    = 1
)

// fill sets the zero fields to their defaults and checks the rest.
func (a *AdmitConfig) fill() error {
	for _, f := range []struct {
		name string
		v    *float64
		def  float64
	}{{"KVUsage", &a.KVUsage, DefaultAdmitKVUsage}, {"PrefillPasses", &a.PrefillPasses, DefaultAdmitPrefillPasses}, {"Waiting", &a.Waiting, DefaultAdmitWaiting}, {"WaitWeight", &a.WaitWeight, DefaultAdmitWaitWeight}} {
		if math.IsNaN(*f.v) || math.IsInf(*f.v, 0) {
			return fmt.Errorf("%w: admission %s %v must be finite", errConfig, f.name, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if a.KVUsage > 1 {
		return fmt.Errorf("%w: admission KVUsage %v is more than the whole cache", errConfig, a.KVUsage)
	}
	return nil
}

// WaitError is Route's answer (with Config.Admit, in a cost mode) when the
// request's cheapest worker, its wait for admission included, cannot
// admit it now: the request should wait in the queue for Worker. It is a
// *kv.BusyError (errors.As, errors.Is kv.ErrAllBusy).
type WaitError struct {
	kv.BusyError
	Worker kv.WorkerKey
}

func (e *WaitError) Error() string {
	return fmt.Sprintf("worker %v, the best for the request, cannot admit it yet: %v", e.Worker, &e.BusyError)
}

func (e *WaitError) Unwrap() error { return &e.BusyError }

// report is a worker's last load report while it counts.
type report struct {
	running, waiting int64
	ok               bool
}

// admits reports whether w can admit req (prompt blocks seq) now; usage is
// its fresh reported KV usage fraction (0 when none). A nil config admits
// everything.
func (a *AdmitConfig) admits(w *worker, req *Request, seq []kv.SeqHash, blockSize int, usage float64, rep report) bool {
	if a == nil {
		return true
	}
	l := w.load
	if l.requests == 0 && (!rep.ok || rep.running+rep.waiting == 0) {
		return true // idle: anything may start here
	}
	if a.Waiting >= 0 && rep.ok && float64(rep.waiting) > a.Waiting*float64(max(rep.running, 1)) {
		return false
	}
	if a.PrefillPasses >= 0 && !req.NoPrefillCharge {
		budget := w.info.MaxBatchedTokens
		if budget <= 0 {
			budget = defaultPassBudget
		}
		if float64(l.prefillTokens) >= a.PrefillPasses*float64(budget) {
			return false
		}
	}
	if capacity := w.info.KVBlocks; a.KVUsage >= 0 && capacity > 0 {
		occupied := max(float64(l.uniqueBlocks()), usage*float64(capacity))
		need := float64(kv.BlocksNeeded(req.promptLen(), blockSize) - l.activePrefix(seq))
		if occupied+need > a.KVUsage*float64(capacity) {
			return false
		}
	}
	return true
}

// admitScorer is the cost modes' admission stage: costScorer's price, plus
// for a worker that cannot admit the request now its predicted wait until
// it can (waitMS, weighted by WaitWeight). Under overload every worker is
// near its thresholds and the queue absorbs the wait, so what separates
// them is the request's own work: its cached prefix, on any tier.
type admitScorer struct{}

func (admitScorer) score(s *selection) {
	costScorer{}.score(s)
	a := s.r.cfg.Admit
	nw := len(s.p.workers)
	s.full = slices.Grow(s.full[:0], nw)[:nw]
	for j, i := range s.cand {
		w := s.p.workers[i]
		rep := s.r.freshReport(w.load, s.now)
		usage := s.r.reportedUsage(w.load, s.now)
		s.full[i] = !a.admits(w, &s.req, s.seq, s.p.blockSize, usage, rep)
		if s.full[i] && a.WaitWeight > 0 {
			s.cost[j] += a.WaitWeight * a.waitMS(w, &s.req, s.seq, s.p.blockSize, usage, rep)
		}
	}
	if !s.req.Aged {
		return
	}
	// An aged request waits for no one: only the workers that admit it
	// now stay, unless none does (then it waits for the best).
	k := 0
	for j, i := range s.cand {
		if !s.full[i] {
			s.cand[k], s.cost[k] = i, s.cost[j]
			k++
		}
	}
	if k > 0 {
		s.cand, s.cost = s.cand[:k], s.cost[:k]
	}
}

// waitMS predicts how long (ms) until w admits req: the longest of its
// thresholds' waits — the prefill above PrefillPasses computed, the KV
// over KVUsage freed by requests leaving at about occupied/residency
// blocks per ms (as admitWait), the waiting requests over Waiting served
// at the rate running ones leave. The time model's price is in ms; the
// block model's in blocks, where this adds a comparable number of ms.
func (a *AdmitConfig) waitMS(w *worker, req *Request, seq []kv.SeqHash, blockSize int, usage float64, rep report) float64 {
	l := w.load
	timing := w.info.Timing.orDefault()
	budget := w.info.MaxBatchedTokens
	if budget <= 0 {
		budget = defaultPassBudget
	}
	var wait float64
	if a.PrefillPasses >= 0 {
		over := float64(l.prefillTokens) - a.PrefillPasses*float64(budget)
		if over >= 0 {
			ms, _ := timing.PrefillWork(over+1, budget)
			wait = ms
		}
	}
	res := l.residencyMS
	if capacity := float64(w.info.KVBlocks); a.KVUsage >= 0 && capacity > 0 && res > 0 {
		occupied := max(float64(l.uniqueBlocks()), usage*capacity)
		need := float64(kv.BlocksNeeded(req.promptLen(), blockSize) - l.activePrefix(seq))
		if over := occupied + need - a.KVUsage*capacity; over > 0 && occupied > 0 {
			wait = max(wait, res*min(over/occupied, 1))
		}
	}
	if a.Waiting >= 0 && rep.ok && res > 0 {
		run := float64(max(rep.running, 1))
		if over := float64(rep.waiting) - a.Waiting*run; over > 0 {
			wait = max(wait, res*min(over/run, 1))
		}
	}
	return wait
}

// Admitting reports whether some worker of model and role could admit a
// request now (Config.Admit; always true without it), counting no prompt
// blocks: a queue's owner skips a dispatch that could place nothing.
func (r *Router) Admitting(model string, role kv.Role) bool {
	return r.admitting(model, role, Request{})
}

// AdmittingDecodeLeg is Admitting for a decode leg over model's decode
// pool: its prompt arrives computed, so no prefill backlog keeps it out.
// When it is false every decode leg of the model is busy, whatever its
// prompt, so a queue's owner need not route them one by one.
func (r *Router) AdmittingDecodeLeg(model string) bool {
	return r.admitting(model, kv.RoleDecode, Request{NoPrefillCharge: true})
}

// admitting reports whether some worker of model and role admits req,
// counting none of its prompt blocks (the least a request can need).
func (r *Router) admitting(model string, role kv.Role, req Request) bool {
	a := r.cfg.Admit
	if a == nil {
		return true
	}
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.pools[poolKey{model, role.Norm()}]
	if p == nil {
		return false
	}
	for _, w := range p.workers {
		if a.admits(w, &req, nil, p.blockSize, r.reportedUsage(w.load, now), r.freshReport(w.load, now)) {
			return true
		}
	}
	return false
}

// Eligible reports whether worker key would be one of req's candidates
// were req routed now: whether it passes the mode's filters (in a mode
// without a price, round-robin or random, admission among them). It
// matches nothing against the index. A queue's owner whose request every
// worker refused (a plain *kv.BusyError, no WaitError) asks it of the
// workers whose state changed since, instead of routing the request
// again: a worker's answer changes only when its load does (a request
// booked, a first token, a request done, a load report), its last report
// ages past LoadReportTTL, or an inhibition ends, so while none of those
// is eligible Route would refuse the request the same way.
func (r *Router) Eligible(req Request, key kv.WorkerKey) bool {
	pk := poolKey{req.Model, req.Role.Norm()}
	var d Decision
	if r.hashPrompt(pk, &req, &d) != nil {
		return false
	}
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.pools[pk]
	if p == nil || p.blockSize != d.BlockSize {
		return false
	}
	i, ok := slices.BinarySearchFunc(p.workers, key, func(w *worker, k kv.WorkerKey) int { return cmpKey(w.info.Key, k) })
	if !ok {
		return false
	}
	req.Exclude = r.exclusions(req.Exclude, now)
	s := r.scratch.Get().(*selection)
	defer r.scratch.Put(s)
	s.r, s.p, s.req, s.seq, s.now = r, p, req, d.Seq, now
	defer s.release()
	for _, f := range r.prof.filters {
		if f.drop(s, p.workers[i]) != kept {
			return false
		}
	}
	return true
}

// LoadReportTTL is how long a worker's load report counts
// (Config.LoadReportTTL, default filled): past it the worker's admission
// may change with no new report (Eligible).
func (r *Router) LoadReportTTL() time.Duration { return r.cfg.LoadReportTTL }

// Changes counts the router's changes of worker state that may change
// whether a worker admits a request: a request booked, its first token or
// its end (here or, through replica events, at another router), a load or
// onboarding report, a worker added, updated, removed or inhibited. A
// queue's owner whose request every worker refused (a plain
// *kv.BusyError) may skip routing it again while the count stands still:
// Route would refuse it the same way, except as time alone changes an
// answer (a load report ageing past LoadReportTTL, an inhibition
// lapsing), which the owner bounds by retrying after a while anyway.
func (r *Router) Changes() uint64 { return r.chg.Load() }
