package twin

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/kv"
)

// The event loop: arrivals, P/D handoffs and each core's pass ends, in
// virtual time, on one goroutine.

type worker struct {
	core *sim.Core
	key  kv.WorkerKey
	// at is the next event: the end of the pass in res when pending, else
	// the start of the next pass; atNS is the same instant in nanoseconds
	// since the twin's start (the event loop compares integers).
	at       time.Time
	atNS     int64
	active   bool
	pending  bool
	reported bool // lastNS holds the last load report
	res      *sim.StepResult
	lastNS   int64
	stalls   int
	// ver counts the changes of the worker's state a queued request may
	// wait for: passes that freed something, load reports.
	ver uint64
	// chgAt is the twin's change count (twin.chg) at the worker's last
	// change of load or report, booking included (touch).
	chgAt uint64
}

// loop handles events in time order: the earliest of the next arrival and
// the active workers' next events, an arrival first on ties, then the
// lowest-numbered worker. Once a worker's event is due it keeps handling
// its own events while they come before every other one (by the same
// order), which saves a scan of the fleet per pass and handles exactly the
// same sequence of events.
func (t *twin) loop(ctx context.Context) error {
	for {
		if err := t.tick(ctx); err != nil {
			return err
		}
		cw, cat := -1, int64(0)
		for i := range t.ws {
			if w := &t.ws[i]; w.active && (cw < 0 || w.atNS < cat) {
				cw, cat = i, w.atNS
			}
		}
		// P/D handoffs (decode legs reaching their cores) come after
		// arrivals and before worker events on ties.
		var hat int64
		var hok bool
		if t.pd != nil {
			hat, hok = t.pd.nextHandoff()
		}
		// Arrivals first on ties, so a burst lands in one pass.
		arr, ok := t.arr.peek()
		if ok && (cw < 0 || arr <= cat) && (!hok || arr <= hat) {
			if err := t.arrive(ctx, arr); err != nil {
				return err
			}
			continue
		}
		if hok && (cw < 0 || hat <= cat) {
			if err := t.handoffEvent(); err != nil {
				return err
			}
			continue
		}
		if cw < 0 {
			if t.waiting() {
				// An idle fleet admits anything; only a bug leaves requests here.
				return fmt.Errorf("twin: requests left in the router queue with every worker idle")
			}
			return nil
		}
		// cw's events stay next while they come before the arrival and
		// before (lower-numbered workers) or not after (higher-numbered)
		// every other worker's next event: no other worker's time changes
		// meanwhile, and only a closed loop's completions add arrivals.
		limit := int64(math.MaxInt64)
		if ok {
			limit = arr
		}
		if hok {
			limit = min(limit, hat)
		}
		for i := range t.ws {
			if w := &t.ws[i]; w.active && i != cw {
				l := w.atNS
				if i > cw {
					l++
				}
				limit = min(limit, l)
			}
		}
		wk := &t.ws[cw]
		for {
			t.woke = false
			if err := t.workerEvent(ctx, cw); err != nil {
				return err
			}
			// A request the queue dispatched may have woken a worker,
			// whose next event then comes first.
			if !wk.active || wk.atNS >= limit || t.woke {
				break
			}
			if t.arr.closed {
				if arr, ok := t.arr.peek(); ok && arr <= wk.atNS {
					break
				}
			}
			if t.pd != nil {
				// A prefill's end may have scheduled an earlier handoff.
				if hat, ok := t.pd.nextHandoff(); ok && hat <= wk.atNS {
					break
				}
			}
			if err := t.tick(ctx); err != nil {
				return err
			}
		}
	}
}

// tick counts an event and checks ctx every 1024 of them.
func (t *twin) tick(ctx context.Context) error {
	t.iter++
	if t.iter&1023 == 1 {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("twin: %w", err)
		}
	}
	return nil
}

// advance sets the twin's time (events are handled in time order, so it
// never goes back).
func (t *twin) advance(now int64) {
	if now > t.now {
		t.now = now
	}
}

// at is the instant ns after the twin's start.
func (t *twin) at(ns int64) time.Time { return t.t0.Add(time.Duration(ns)) }

// syncClock brings the router's virtual clock to the twin's time; called
// before the router reads it (Route, UpdateLoad) rather than at every event.
func (t *twin) syncClock() {
	if t.now != t.vcNow {
		t.vc.AdvanceTo(t.at(t.now))
		t.vcNow = t.now
	}
}

// workerEvent handles worker w's next event: the end of its pending pass
// (outputs reach the router at that time), then the start of the next.
func (t *twin) workerEvent(ctx context.Context, w int) error {
	wk := &t.ws[w]
	now, nowNS := wk.at, wk.atNS
	t.advance(nowNS)
	if wk.pending {
		wk.pending = false
		if res := wk.res; res.FirstTokens > 0 || res.Finished > 0 {
			t.handle(res, now, nowNS)
			t.changed(w)
			// Capacity freed: the queue's requests go out before the
			// worker's next pass starts, so they can join it.
			if err := t.dispatch(ctx, nowNS); err != nil {
				return err
			}
		}
	}
	if wk.core.Idle() {
		wk.active = false
	} else {
		res := wk.core.Step(now)
		if res.Seqs == 0 && res.Loading > 0 {
			// Only onboarding in flight: step again when it lands.
			wk.stalls = 0
			wk.at, wk.atNS = res.End, nowNS+int64(res.Duration)
		} else if res.Seqs == 0 {
			// Nothing fits right now; only pinned blocks could cause it.
			if wk.stalls++; wk.stalls > stallLimit {
				return fmt.Errorf("twin: worker %d scheduled nothing for %d passes", w+1, stallLimit)
			}
			wk.at, wk.atNS = now.Add(time.Millisecond), nowNS+int64(time.Millisecond)
		} else {
			wk.stalls = 0
			// res.End is now + res.Duration.
			wk.res, wk.pending, wk.at, wk.atNS = res, true, res.End, nowNS+int64(res.Duration)
			t.res.Passes++
		}
	}
	if !wk.active || !wk.reported || nowNS-wk.lastNS >= int64(t.cfg.LoadInterval) {
		st := wk.core.Stats()
		t.syncClock()
		t.r.UpdateLoad(wk.key, st.UsedBlocks, st.TotalBlocks, st.Running, st.Waiting)
		if t.cfg.KVBM != nil {
			t.r.UpdateOnboarding(wk.key, wk.core.OnboardBacklog(now))
		}
		wk.lastNS, wk.reported = nowNS, true
		t.changed(w)
		if t.waiting() {
			return t.dispatch(ctx, nowNS) // the report may let it admit
		}
	}
	return nil
}

// handle delivers a finished pass's first tokens and completions.
func (t *twin) handle(res *sim.StepResult, now time.Time, nowNS int64) {
	for i := range res.Outputs {
		o := &res.Outputs[i]
		if !o.First && o.Finish == kv.FinishNone {
			continue
		}
		st, ok := o.Seq.Tag.(*request)
		if !ok {
			if p, ok := o.Seq.Tag.(*pdReq); ok && o.Finish != kv.FinishNone {
				t.prefillDone(p, o, now, nowNS)
			}
			continue
		}
		if o.First {
			st.dec.FirstToken()
		}
		if o.Finish != kv.FinishNone {
			st.dec.Done()
			t.complete(st, now, nowNS)
		}
	}
}

// wake makes worker w handle events from atNS on.
func (t *twin) wake(w int, atNS int64) {
	if wk := &t.ws[w]; !wk.active {
		wk.active, wk.pending, wk.at, wk.atNS = true, false, t.at(atNS), atNS
		t.woke = true
	}
}
