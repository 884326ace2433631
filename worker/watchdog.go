package worker

import (
	"context"
	"sync/atomic"
	"time"
)

// DefaultStallTimeout is Config.StallTimeout's default.
const DefaultStallTimeout = 30 * time.Second

// watchdog notices an engine that hangs while the process lives (an NCCL
// hang, a stuck scheduler): streams are in flight but the engine produced
// nothing for the stall timeout. Such a worker still answers gRPC and
// refreshes its discovery record, so nothing else would notice it.
type watchdog struct {
	outputs  atomic.Uint64 // chunks the engine produced, any stream
	inflight atomic.Int64  // Generate streams waiting on the engine (not on a slow caller)
	stalled  atomic.Bool
	stallCh  chan struct{} // closed when the engine is declared stalled
}

func newWatchdog() *watchdog { return &watchdog{stallCh: make(chan struct{})} }

// stallCheck is the watchdog's decision, fed one sample per tick; kept
// apart from the clock and the goroutine so it can be tested step by step.
type stallCheck struct {
	timeout time.Duration
	outputs uint64    // the output count at since
	since   time.Time // when the current silence with streams in flight was first seen; zero: none
}

// observe takes one sample and says whether the engine is stalled: streams
// were in flight at every sample for timeout and the output count did not
// move. The silence starts at the first sample that sees streams after an
// idle one, never before, so a request arriving at an idle worker gets the
// whole timeout.
func (s *stallCheck) observe(now time.Time, outputs uint64, inflight int64) bool {
	if s.timeout <= 0 {
		return false
	}
	if inflight <= 0 || s.since.IsZero() || outputs != s.outputs {
		s.outputs = outputs
		if inflight <= 0 {
			s.since = time.Time{}
		} else {
			s.since = now
		}
		return false
	}
	return now.Sub(s.since) >= s.timeout
}

// runWatchdog samples the engine's progress every quarter timeout until ctx
// ends or the engine stalls.
func (w *Worker) runWatchdog(ctx context.Context) {
	timeout := w.cfg.StallTimeout
	t := time.NewTicker(max(timeout/4, time.Millisecond))
	defer t.Stop()
	chk := stallCheck{timeout: timeout}
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if n := w.wd.inflight.Load(); chk.observe(now, w.wd.outputs.Load(), n) {
				w.declareStalled(n)
				return
			}
		}
	}
}

// declareStalled takes the worker out of service for good: new Generate
// calls and every open stream fail with Unavailable (the frontend migrates
// them), and the discovery record goes so routers stop choosing it. It does
// not come back if the engine recovers: an engine that hung once is not
// trusted again, and Health reports not ok so whatever supervises the
// process can restart it.
func (w *Worker) declareStalled(inflight int64) {
	w.wd.stalled.Store(true)
	w.met.stalls.Inc()
	w.met.healthy.Set(0)
	w.log.Error("engine stalled: no output with streams in flight; failing its streams and leaving discovery",
		"stall_timeout", w.cfg.StallTimeout, "inflight", inflight)
	close(w.wd.stallCh)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := w.deregister(ctx); err != nil {
		w.log.Warn("stalled worker could not deregister; its record expires after the TTL", "err", err)
	}
}

// Stalled reports whether the watchdog took the worker out of service.
func (w *Worker) Stalled() bool { return w.wd.stalled.Load() }
