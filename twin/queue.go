package twin

import (
	"context"
	"errors"

	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/tracefile"
)

// Queue is the twin's router queue (Config.Queue): a request no worker
// can admit (router.AdmitConfig) waits in a router.Queue and is routed
// when a pass ends or a load report frees capacity, with the fleet's
// state at that moment. Its wait counts in its TTFT.
type Queue struct {
	router.QueueConfig
	Admit router.AdmitConfig `json:"admit"`
}

// QueueStats is what the router queue did (Config.Queue).
type QueueStats struct {
	Policy string `json:"policy"`
	// Queued counts the requests that waited; Wait is every dispatched
	// request's wait (ms, 0 for those that did not), so its mean is the
	// queue's share of the mean TTFT.
	Queued   int  `json:"queued"`
	MaxDepth int  `json:"max_depth"`
	Wait     Dist `json:"wait_ms"`
	// DecodeQueued (P/D) counts the decode legs that waited for a decode
	// worker after their prefill (their wait is in their TTFT, not Wait).
	DecodeQueued int `json:"decode_queued,omitempty"`
}

// queued is one waiting trace request.
type queued struct {
	i     int // index in the workload
	plen  int
	rr    router.Request
	arrNS int64
	// waitW is the worker the router last said the request waits for
	// (-1: none), as of that worker's version waitVer: until the worker
	// changes, asking again would get the same answer.
	waitW   int
	waitVer uint64
	// refused: every worker refused the request (a plain busy answer,
	// round-robin's), as of the twin's change count refusedAt: until a
	// worker changes after that, asking again would get the same answer.
	refused   bool
	refusedAt uint64
	// P/D: the request's leg plan and the step it waits to route (Do 0:
	// not started: the plan starts at dispatch, with the fleet's state
	// then), and its prompt for the sim.
	plan   *router.LegPlan
	step   router.Step
	prompt sim.Prompt
}

// enqueue holds trace request i (router request rr of plen tokens,
// arrived at atNS) in the router queue, or rejects it past the limit.
func (t *twin) enqueue(i, plen int, rr router.Request, atNS int64) *router.Queued[queued] {
	return t.push(queued{i: i, plen: plen, rr: rr, arrNS: atNS, waitW: -1})
}

// push holds q in the router queue (its handle), or rejects it past the
// limit (nil).
func (t *twin) push(q queued) *router.Queued[queued] {
	if q.rr.Tokens != nil {
		// The prompt buffer is the next arrival's: hash the prompt once,
		// as arrivePD does.
		q.rr.Local = kv.LocalHashes(nil, q.rr.Tokens, t.cfg.BlockSize, kv.Seed("", ""))
		q.rr.Tokens, q.rr.PromptLen = nil, q.plen
	}
	if q.rr.Seq == nil && len(q.rr.Local) > 0 {
		// A queued request is routed again and again: chain its hashes once.
		q.rr.Seq = kv.SeqHashes(make([]kv.SeqHash, 0, len(q.rr.Local)), q.rr.Local)
	}
	q.waitW, q.refused = -1, false
	atNS := q.arrNS
	// WSPT's work: the prompt's tokens (the router predicts its cached
	// part only when it routes).
	e, err := t.q.Push(q, t.at(atNS), float64(q.plen), 0)
	if err != nil {
		t.reject(&t.res.RejectedBusy, atNS, "router queue full")
		return nil
	}
	t.res.Queue.Queued++
	t.res.Queue.MaxDepth = max(t.res.Queue.MaxDepth, t.q.Len())
	return e
}

// dispatch routes waiting requests, in the queue's order, to the workers
// that admit them; one whose best worker is busy stays, and those behind
// it (up to the queue's lookahead) still go.
func (t *twin) dispatch(ctx context.Context, nowNS int64) error {
	if t.q == nil || !t.waiting() {
		return nil
	}
	t.syncClock()
	if t.pd != nil {
		// Decode legs first: their prefill is done and holds its blocks.
		t.dispatchDecodes(nowNS)
	}
	if t.q.Len() == 0 || !t.admitting() {
		return nil
	}
	var ferr error
	now := t.at(nowNS)
	t.q.Scan(now, t.q.Config().Lookahead, func(e *router.Queued[queued]) (take, stop bool) {
		q := &e.Value
		if !q.rr.Aged && t.q.Aged(e, now) {
			q.rr.Aged, q.waitW, q.refused = true, -1, false // it now takes any worker that admits it
		}
		if q.waitW >= 0 && t.ws[q.waitW].ver == q.waitVer {
			return false, false
		}
		if q.refused && !reaskRefused && !t.mayAdmit(q, nowNS) {
			t.res.refusedSkips++
			return false, false
		}
		var d *router.Decision
		var err error
		if q.plan != nil {
			err = t.routePD(ctx, q, nowNS)
		} else {
			d, err = t.r.Route(ctx, q.rr)
		}
		var we *router.WaitError
		if errors.As(err, &we) {
			q.waitW = int(we.Worker.Instance) - 1
			q.waitVer = t.ws[q.waitW].ver
			return false, false
		}
		if errors.Is(err, kv.ErrAllBusy) {
			t.refuse(q)
			return false, false
		}
		rq := &t.wl.Requests[e.Value.i]
		if err != nil {
			ferr = t.routeFailed(err, nowNS, rq.Line)
			return true, ferr != nil
		}
		if q.plan != nil {
			return true, false // routePD started its leg
		}
		if t.prompt.ph == nil {
			// start reads the prompt's tail from the buffer: refill it.
			t.prompt.request(rq, e.Value.plen, t.wl.TraceBlockSize)
		}
		ferr = t.start(e.Value.i, rq, e.Value.plen, d, nowNS, e.Value.arrNS)
		return true, ferr != nil
	})
	return ferr
}

// route routes trace request i at atNS and starts it, or queues it when no
// worker admits it (Config.Queue); with requests already waiting it queues
// behind them, so it does not overtake them.
func (t *twin) route(ctx context.Context, i int, rq *tracefile.Request, plen int, rr router.Request, atNS int64) error {
	if t.q != nil && t.q.Len() > 0 {
		t.enqueue(i, plen, rr, atNS)
		return t.dispatch(ctx, atNS)
	}
	d, err := t.r.Route(ctx, rr)
	if err != nil {
		if t.q != nil && errors.Is(err, kv.ErrAllBusy) {
			var we *router.WaitError
			if e := t.enqueue(i, plen, rr, atNS); e != nil && !errors.As(err, &we) {
				t.refuse(&e.Value)
			}
			return nil
		}
		return t.routeFailed(err, atNS, rq.Line)
	}
	return t.start(i, rq, plen, d, atNS, atNS)
}

// Round-robin names no worker to wait for: its busy answer means every
// worker refused the request. A worker's answer changes only with its
// router-side load (a request booked or started on it, a first token, a
// request done: noted by touch) or its load report (a report, noted too,
// or the last one ageing past the router's LoadReportTTL), so a refused
// request is asked again only of the workers touched since
// (router.Eligible), and routed only once one of them would take it. With
// P/D the same holds for the leg a started plan routes again (q.step).

// reaskRefused routes every refused request again at each dispatch, as
// before the skip; a test sets it to check the skip changes no outcome.
var reaskRefused bool

// touch notes a change of worker w that may change its admission of a
// refused request.
func (t *twin) touch(w int) {
	t.chg++
	t.ws[w].chgAt = t.chg
}

// refuse notes that every worker refused q now (a plain busy answer;
// the cost modes' WaitError names its worker instead).
func (t *twin) refuse(q *queued) {
	if q.plan != nil && q.step.Do != router.ActRoute {
		return // P/D, its plan not started: starting it reads every pool
	}
	q.refused, q.refusedAt = true, t.chg
}

// mayAdmit reports whether some worker touched since q was refused, or
// whose last load report has aged out since, would take q now; when none
// would, Route would refuse q again. It notes q refused as of now.
func (t *twin) mayAdmit(q *queued, nowNS int64) bool {
	req := q.rr
	if q.plan != nil {
		req = q.step.Req // P/D: the leg routePD would route again
	}
	ttl := int64(t.r.LoadReportTTL())
	for w := range t.ws {
		wk := &t.ws[w]
		if wk.chgAt <= q.refusedAt && nowNS-wk.lastNS <= ttl {
			continue
		}
		if t.r.Eligible(req, wk.key) {
			return true
		}
	}
	q.refusedAt = t.chg
	return false
}

// waiting reports whether anything waits for a worker: the queue, or
// (P/D) decode legs.
func (t *twin) waiting() bool {
	return t.q != nil && (t.q.Len() > 0 || (t.pd != nil && len(t.pd.waitDecode) > 0))
}

// admitting reports whether some pool a queued request routes to could
// admit one now (router.Admitting): when none can, a dispatch would place
// nothing.
func (t *twin) admitting() bool {
	if t.pd == nil {
		return t.r.Admitting(model, "")
	}
	return t.pd.agg > 0 && t.r.Admitting(model, "") || t.r.Admitting(model, kv.RolePrefill) || t.r.Admitting(model, kv.RoleDecode)
}
