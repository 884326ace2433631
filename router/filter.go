package router

import (
	"fmt"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// Routing runs in stages (the mode's profile, see stages.go): filters
// narrow a pool to the request's candidates, a scorer prices each
// candidate, a picker chooses one. This file holds the filters.

// dropReason says why a filter removed a worker from a request's
// candidates; the counts per reason make the error when none is left.
type dropReason uint8

const (
	kept           dropReason = iota
	dropNoAdapter             // it does not serve the request's LoRA adapter
	dropDecodeOnly            // it cannot compute a prompt (a decode-only engine)
	dropExcluded              // the request excludes it, or it is inhibited
	dropBusy                  // it is over a busy threshold
	dropFull                  // it cannot admit the request now (Config.Admit)
	numDropReasons
)

// filter is one stage that narrows a request's candidates. It returns why
// it removes w from s's candidates, or kept. It runs under the router's
// lock and must not call back into the router.
type filter interface {
	drop(s *selection, w *worker) dropReason
	// idle reports that the filter drops no worker of s's pool for s's
	// request (a request for the base model, with nothing excluded), so
	// filter need not ask it worker by worker.
	idle(s *selection) bool
}

// adapterFilter keeps the workers that serve the request's LoRA adapter.
type adapterFilter struct{}

func (adapterFilter) drop(s *selection, w *worker) dropReason {
	if !servesAdapter(w, s.req.LoRA) {
		return dropNoAdapter
	}
	return kept
}

func (adapterFilter) idle(s *selection) bool { return s.req.LoRA == "" }

// servesAdapter: w may take a request for adapter lora ("" is the base
// model, served by every worker).
func servesAdapter(w *worker, lora string) bool {
	return lora == "" || slices.Contains(w.info.LoRAs, lora)
}

// decodeOnlyFilter drops decode-only workers unless the request is a
// decode leg, whose prompt arrives computed. Such a worker stays a hint
// source.
type decodeOnlyFilter struct{}

func (decodeOnlyFilter) drop(s *selection, w *worker) dropReason {
	if w.info.DecodeOnly && !s.req.NoPrefillCharge {
		return dropDecodeOnly
	}
	return kept
}

func (decodeOnlyFilter) idle(s *selection) bool { return s.req.NoPrefillCharge || s.p.decodeOnly == 0 }

// exclusionFilter drops the workers the request excludes and the
// inhibited ones (route adds those to Request.Exclude).
type exclusionFilter struct{}

func (exclusionFilter) drop(s *selection, w *worker) dropReason {
	if slices.Contains(s.req.Exclude, w.info.Key) {
		return dropExcluded
	}
	return kept
}

func (exclusionFilter) idle(s *selection) bool { return len(s.req.Exclude) == 0 }

// busyFilter drops the workers past a busy threshold of the router's
// config.
type busyFilter struct{}

func (busyFilter) idle(s *selection) bool {
	c := &s.r.cfg
	return c.MaxPrefillTokens <= 0 && c.MaxPrefillFrac <= 0 && c.MaxKVUsage <= 0
}

func (busyFilter) drop(s *selection, w *worker) dropReason {
	if s.r.busy(w, s.now) {
		return dropBusy
	}
	return kept
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

// admitFilter drops the workers that cannot admit the request now
// (Config.Admit): the request waits in the router queue instead.
type admitFilter struct{}

func (admitFilter) drop(s *selection, w *worker) dropReason {
	if !s.r.cfg.Admit.admits(w, &s.req, s.seq, s.p.blockSize, s.r.reportedUsage(w.load, s.now), s.r.freshReport(w.load, s.now)) {
		return dropFull
	}
	return kept
}

func (admitFilter) idle(*selection) bool { return false }

// drops counts the workers each reason removed.
type drops [numDropReasons]int

// err is the error for a request none of whose nw workers is left: the
// first of these that holds, in order — no worker serves its adapter; only
// decode-only ones could; every other one is excluded; else every one left
// is busy (a *kv.BusyError, which the caller may retry).
func (d *drops) err(req *Request, nw int, retryAfter time.Duration) error {
	switch {
	case d[dropNoAdapter] == nw:
		return fmt.Errorf("%w for model %q with LoRA adapter %q", kv.ErrNoWorkers, req.Model, req.LoRA)
	case d[dropDecodeOnly] > 0 && d[dropDecodeOnly]+d[dropNoAdapter] == nw:
		return fmt.Errorf("%w for model %q: %w", kv.ErrNoWorkers, req.Model, ErrDecodeOnly)
	case d[dropExcluded]+d[dropNoAdapter]+d[dropDecodeOnly] == nw:
		return fmt.Errorf("%w for model %q: all %d excluded", kv.ErrNoWorkers, req.Model, nw)
	}
	return &kv.BusyError{Model: req.Model, Workers: nw - d[dropExcluded], RetryAfter: retryAfter}
}

// filter runs filters over the pool, leaving s.cand the indices of the
// workers none of them dropped, or the error that says why none is left.
// Filters idle for the request are not asked: they would keep every
// worker.
func (s *selection) filter(filters []filter) error {
	s.cand = s.cand[:0]
	active := s.active[:0]
	for _, f := range filters {
		if !f.idle(s) {
			active = append(active, f)
		}
	}
	s.active = active
	var d drops
	if len(active) == 0 {
		for i := range s.p.workers {
			s.cand = append(s.cand, i)
		}
	} else {
		for i, w := range s.p.workers {
			why := kept
			for _, f := range active {
				if why = f.drop(s, w); why != kept {
					break
				}
			}
			d[why]++
			if why == kept {
				s.cand = append(s.cand, i)
			}
		}
	}
	if len(s.cand) == 0 {
		return d.err(&s.req, len(s.p.workers), s.r.cfg.BusyRetryAfter)
	}
	return nil
}
