package router

import (
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// profile is a mode as a named sequence of stages: filters narrow the pool
// to the request's candidates, a scorer prices them (nil: the picker needs
// no price), a picker chooses one. A new stage (an admission filter, a
// queue-aware scorer) is a new value in a profile, not a branch in route.
type profile struct {
	filters []filter
	scorer  scorer
	picker  picker
	// holdFull: a pick that cannot admit the request (s.full) answers
	// busy, so the request waits for it.
	holdFull bool
}

// baseFilters are every mode's filters, in the order their reasons take
// precedence when one worker fails several.
var baseFilters = []filter{adapterFilter{}, decodeOnlyFilter{}, exclusionFilter{}, busyFilter{}}

// admitFilters are baseFilters and the admission stage (Config.Admit).
var admitFilters = append(baseFilters[:len(baseFilters):len(baseFilters)], admitFilter{})

// profileOf is mode m's profile; admit adds the admission stage. Modes
// without a price filter out the workers that cannot admit; cost modes
// price them with their wait for admission instead (admitScorer), and a
// request whose cheapest worker is one of them waits in the queue for it.
func profileOf(m Mode, admit bool) profile {
	switch m {
	case ModeRoundRobin, ModeRandom:
		fs := baseFilters
		if admit {
			fs = admitFilters
		}
		if m == ModeRandom {
			return profile{filters: fs, picker: uniformPick{}}
		}
		return profile{filters: fs, picker: roundRobin{}}
	}
	if admit {
		return profile{filters: baseFilters, scorer: admitScorer{}, picker: costPick{}, holdFull: true}
	}
	return profile{filters: baseFilters, scorer: costScorer{}, picker: costPick{}}
}

// selection is one request's pass through the stages: what they read, and
// the working memory they fill. Pooled, so Route does not allocate it.
type selection struct {
	r   *Router
	p   *pool
	req Request
	seq []kv.SeqHash // the prompt's full blocks
	now time.Time
	cm  *CostModel // the request's cost model

	matches []Match               // the index's, sorted by worker
	depth   [][kv.NumTiers]uint32 // per pool worker: cumulative cached prefix
	cand    []int                 // pool indices still eligible
	active  []filter              // filter's: the filters not idle for the request
	cost    []float64             // per candidate, from the scorer
	full    []bool                // per pool worker: cannot admit now (admitScorer)
	touched int64                 // keeps costScorer's warming loads
}

// release drops the selection's references before it goes back to the
// pool.
func (s *selection) release() {
	s.r, s.p, s.req, s.seq, s.cm = nil, nil, Request{}, nil, nil
}

// choose runs r's profile over s.p and returns the index in the pool of
// the worker to use. Called with r.mu held.
func (r *Router) choose(s *selection) (int, error) {
	s.mergeDepth()
	if err := s.filter(r.prof.filters); err != nil {
		return 0, err
	}
	if r.prof.scorer != nil {
		r.prof.scorer.score(s)
	}
	i := r.prof.picker.pick(s)
	if r.prof.holdFull && s.full[i] {
		return 0, &WaitError{BusyError: kv.BusyError{Model: s.req.Model, Workers: len(s.cand), RetryAfter: r.cfg.BusyRetryAfter},
			Worker: s.p.workers[i].info.Key}
	}
	return i, nil
}

// mergeDepth merges the sorted matches with the sorted pool into s.depth.
// Each depth is clamped to the request and made cumulative, so a
// misbehaving index cannot credit blocks the request lacks. A worker that
// does not serve the request's adapter gets none, so it is no hint source
// either, nor does any worker when the request earns no overlap credit.
func (s *selection) mergeDepth() {
	slots := s.p.slots
	nw := len(slots)
	s.depth = slices.Grow(s.depth[:0], nw)[:nw]
	clear(s.depth)
	if s.req.NoOverlapCredit {
		return
	}
	n := uint32(len(s.seq))
	lora, routed := s.req.LoRA, s.r.cfg.CreditRouted
	ms := s.matches
	mi := 0
	for i := range slots {
		sl := &slots[i]
		for mi < len(ms) && cmpKey(ms[mi].Worker, sl.key) < 0 {
			mi++
		}
		var d [kv.NumTiers]uint32
		if mi < len(ms) && ms[mi].Worker == sl.key {
			d = ms[mi].Depth
		} else if !routed {
			continue // no match, nothing routed: zero, as cleared
		}
		if lora != "" && !servesAdapter(sl.w, lora) {
			continue
		}
		var prev uint32
		if routed {
			// Blocks routed here and still active are on its device (or
			// being computed there) before any KV event says so.
			prev = uint32(sl.load.activePrefix(s.seq))
		}
		var c [kv.NumTiers]uint32
		for t, v := range d {
			prev = max(prev, min(v, n))
			c[t] = prev
		}
		s.depth[i] = c
	}
}

// regret is the prefix (tokens, clamped to the prompt of isl tokens) the
// best-placed candidate holds, and what pool worker chosen holds.
func (s *selection) regret(chosen, blockSize, isl int) (reachable, routed int) {
	const all = kv.NumTiers - 1 // depths are cumulative: the last tier counts them all
	var best uint32
	for _, i := range s.cand {
		best = max(best, s.depth[i][all])
	}
	return min(int(best)*blockSize, isl), min(int(s.depth[chosen][all])*blockSize, isl)
}
