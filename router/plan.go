package router

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvmesh/kvmesh/kv"
)

// The leg planner: one request's way through a model's pools, the rules
// the live fleet and the twin share. It is a state machine the caller
// drives (as raft's Ready): Start says what to do first; the caller routes
// the leg the Step names and runs it, and reports what happened — the
// routing failed (RouteFailed), the leg answered (Answered), its worker
// was lost before answering (Lost) — and gets the next Step. The planner
// does no I/O and books nothing: it reads the pools through a PlanView
// once, at Start.
//
// The rules: a model without both a prefill and a decode pool is served
// whole by its aggregated pool; a mixed fleet sends a request whole to the
// aggregated pool while that pool is the less loaded (PreferAggregated);
// otherwise conditional disaggregation (PlanDisagg) chooses a local
// prefill on a decode worker or a prefill leg. A prefill leg that finds
// every prefill worker busy, or whose workers are lost MaxPrefillTries
// times (or run out), falls back to a local prefill; a lost prefill worker
// is excluded and the leg retried on another. A prefill that answers with
// the whole answer ends the request, else a decode leg follows.
//
// With a router queue (LegPlan.Queue), a leg whose pool cannot admit it
// waits in the caller's queue instead of failing: the caller does not
// report the busy answer (RouteFailed) but routes the same Step again when
// a worker may admit it. The busy prefill pool's local-prefill fallback
// then comes only from conditional disaggregation at Start, which also
// plans a prefill leg when even the decode pool is busy (rather than
// refusing), so a disaggregated request under overload waits for a
// prefill worker, and its decode leg for a decode worker.

// MaxPrefillTries bounds the prefill workers one request tries.
const MaxPrefillTries = 3

// Action is what a Step asks of the caller.
type Action uint8

const (
	// ActRoute: route Step.Req and run it as Step.Leg, then report.
	ActRoute Action = iota + 1
	// ActDone: the request is served; nothing more to do.
	ActDone
	// ActFail: give the request up with Step.Err.
	ActFail
)

// Step is the planner's next instruction.
type Step struct {
	Do     Action
	Leg    kv.Leg      // ActRoute: whole, prefill or decode
	Req    Request     // ActRoute: the leg's request, shaped for its pool
	Path   DisaggPath  // the serving path the leg belongs to
	Reason LocalReason // PathLocalPrefill: why
	// Retry: a prefill leg tried again after its worker was lost.
	Retry bool
	Err   error // ActFail
	// RouterErr: Err is what the caller reported (the router's answer,
	// or a lost leg's error), passed through for it to map; else the
	// planner states it and it goes out as it is.
	RouterErr bool
}

// ReasonPrefillFailed: every prefill worker tried was lost (or none was
// left), so the decode worker prefills itself.
const ReasonPrefillFailed LocalReason = "prefill_failed"

// ErrPrefillExhausted is the cause of a ReasonPrefillFailed fallback.
var ErrPrefillExhausted = errors.New("no prefill worker answered")

// PoolSizes counts a model's workers per role.
type PoolSizes struct{ Agg, Prefill, Decode int }

// Disagg: both halves of a disaggregated pool are there.
func (p PoolSizes) Disagg() bool { return p.Prefill > 0 && p.Decode > 0 }

// Unservable says why a model without aggregated workers cannot be served
// ("" when it can).
func (p PoolSizes) Unservable(model string) string {
	switch {
	case p.Agg > 0 || p.Disagg():
		return ""
	case p.Prefill > 0:
		return fmt.Sprintf("model %s has %d prefill workers but no decode workers", model, p.Prefill)
	case p.Decode > 0:
		return fmt.Sprintf("model %s has %d decode workers but no prefill workers", model, p.Decode)
	}
	return fmt.Sprintf("no worker serves %s yet", model)
}

// PoolSizes counts model's workers per role.
func (r *Router) PoolSizes(model string) PoolSizes {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := func(role kv.Role) int {
		if p := r.pools[poolKey{model, role}]; p != nil {
			return len(p.workers)
		}
		return 0
	}
	return PoolSizes{Agg: n(kv.RoleAggregated), Prefill: n(kv.RolePrefill), Decode: n(kv.RoleDecode)}
}

// PlanView is what the planner reads about the fleet (a *Router).
type PlanView interface {
	PoolSizes(model string) PoolSizes
	PreferAggregated(model string) bool
	PlanDisagg(ctx context.Context, req Request, cfg DisaggConfig) (DisaggChoice, error)
}

// LegPlan is one request's planner. The zero value is not usable: make
// one with NewLegPlan.
type LegPlan struct {
	// Queue: the caller holds busy legs in a router queue (see above).
	Queue bool
	cfg   DisaggConfig
	base  Request
	at    Step  // the step being carried out
	tries int   // prefill workers lost so far
	cause error // why a prefill fell back to a local prefill
}

// NewLegPlan plans base (its Role is ignored) under cfg.
func NewLegPlan(base Request, cfg DisaggConfig) LegPlan {
	return LegPlan{cfg: cfg, base: base}
}

// Start reads the pools and returns the first step.
func (l *LegPlan) Start(ctx context.Context, v PlanView) Step {
	model := l.base.Model
	p := v.PoolSizes(model)
	if !p.Disagg() {
		if p.Agg == 0 && (p.Prefill > 0 || p.Decode > 0) {
			return l.fail(fmt.Errorf("%w: %s", kv.ErrNoWorkers, p.Unservable(model)))
		}
		return l.whole(PathAggregated, "")
	}
	if p.Agg > 0 && v.PreferAggregated(model) {
		return l.whole(PathAggregated, "")
	}
	choice, err := v.PlanDisagg(ctx, l.base, l.cfg)
	switch {
	case err != nil && p.Agg > 0:
		return l.whole(PathAggregated, "")
	case err != nil && l.Queue && errors.Is(err, kv.ErrAllBusy):
		// Every decode worker is busy: the prefill leg goes first (or
		// waits for a prefill worker); its decode leg waits its turn.
		return l.prefill(false)
	case err != nil:
		return l.routeFail(err)
	case choice.Path == PathLocalPrefill:
		return l.whole(PathLocalPrefill, choice.Reason)
	}
	return l.prefill(false)
}

// RouteFailed reports that routing the current step's leg failed with err.
func (l *LegPlan) RouteFailed(err error) Step {
	switch {
	case l.at.Leg == kv.LegPrefill && errors.Is(err, kv.ErrAllBusy):
		l.cause = err
		return l.whole(PathLocalPrefill, ReasonPrefillBusy)
	case l.at.Leg == kv.LegPrefill && errors.Is(err, kv.ErrNoWorkers) && l.tries > 0:
		l.cause = ErrPrefillExhausted
		return l.whole(PathLocalPrefill, ReasonPrefillFailed)
	case l.cause != nil && errors.Is(err, ErrDecodeOnly):
		// The fallback has nowhere to go: no decode worker prefills alone.
		var busy *kv.BusyError
		if errors.As(l.cause, &busy) {
			return l.fail(&kv.BusyError{Model: busy.Model, Workers: busy.Workers, RetryAfter: busy.RetryAfter})
		}
		return l.fail(fmt.Errorf("%w: %v, and model %q's decode workers cannot prefill alone", kv.ErrNoWorkers, l.cause, l.base.Model))
	}
	return l.routeFail(err)
}

// Answered reports that the current leg answered; final: its answer was
// the whole answer (a prefill leg whose one token ended the request).
func (l *LegPlan) Answered(final bool) Step {
	if l.at.Leg == kv.LegPrefill && !final {
		return l.set(Step{Do: ActRoute, Leg: kv.LegDecode, Req: DecodeLegRequest(l.base), Path: PathDisagg})
	}
	return l.set(Step{Do: ActDone, Path: l.at.Path, Reason: l.at.Reason})
}

// Lost reports that the current leg's worker was lost before it answered.
// A prefill leg is retried on another prefill worker, up to
// MaxPrefillTries, then falls back to a local prefill; any other leg
// fails with err (the caller may migrate the request).
func (l *LegPlan) Lost(worker kv.WorkerKey, err error) Step {
	if l.at.Leg != kv.LegPrefill {
		return l.routeFail(err)
	}
	l.tries++
	if l.tries >= MaxPrefillTries {
		l.cause = ErrPrefillExhausted
		return l.whole(PathLocalPrefill, ReasonPrefillFailed)
	}
	l.prefill(true)
	l.at.Req.Exclude = append(l.at.Req.Exclude, worker)
	return l.at
}

// Fallback is why the request fell back to a local prefill after its
// prefill leg could not run (nil when it did not).
func (l *LegPlan) Fallback() error { return l.cause }

func (l *LegPlan) set(s Step) Step {
	l.at = s
	return s
}

// fail gives up with the planner's own error; routeFail with the one the
// caller reported.
func (l *LegPlan) fail(err error) Step { return l.set(Step{Do: ActFail, Err: err}) }

func (l *LegPlan) routeFail(err error) Step {
	return l.set(Step{Do: ActFail, Err: err, RouterErr: true})
}

// whole is the step that serves the request in one leg: on the aggregated
// pool, or prefilled locally on a decode worker.
func (l *LegPlan) whole(path DisaggPath, reason LocalReason) Step {
	req := l.base
	req.Role = kv.RoleAggregated
	if path == PathLocalPrefill {
		req = LocalPrefillRequest(l.base)
	}
	return l.set(Step{Do: ActRoute, Leg: kv.LegWhole, Req: req, Path: path, Reason: reason})
}

// prefill is the step that routes the prefill leg, keeping the workers a
// retry excludes.
func (l *LegPlan) prefill(retry bool) Step {
	req := PrefillLegRequest(l.base)
	if retry {
		req.Exclude = l.at.Req.Exclude[:len(l.at.Req.Exclude):len(l.at.Req.Exclude)] // an append copies
	}
	return l.set(Step{Do: ActRoute, Leg: kv.LegPrefill, Req: req, Path: PathDisagg, Retry: retry})
}

// The three leg-request shapes.

// PrefillLegRequest is req as a prefill leg: KV-routed (overlap + load)
// over the prefill pool, hint planned as usual.
func PrefillLegRequest(req Request) Request {
	req.Role = kv.RolePrefill
	req.NoOverlapCredit, req.NoPrefillCharge = false, false
	return req
}

// DecodeLegRequest is req as a decode leg: routed over the decode pool by
// load alone, no overlap credit (so no hint) and the prompt not charged as
// prefill, since its KV arrives from the prefill worker.
func DecodeLegRequest(req Request) Request {
	req.Role = kv.RoleDecode
	req.NoOverlapCredit, req.NoPrefillCharge = true, true
	return req
}

// ErrDecodeOnly is matched by the kv.ErrNoWorkers error of a whole request
// (aggregated or LocalPrefillRequest) whose only candidates are decode
// workers that cannot prefill alone (WorkerInfo.DecodeOnly).
var ErrDecodeOnly = errors.New("its decode workers cannot prefill alone (decode-only engines such as SGLang's): a request needs a prefill worker")

// LocalPrefillRequest is req served whole by a decode worker (conditional
// disaggregation's bypass): routed like an aggregated request (overlap,
// prefill charge, hint) over the decode pool, since that worker computes
// the prompt itself.
func LocalPrefillRequest(req Request) Request {
	req.Role = kv.RoleDecode
	req.NoOverlapCredit, req.NoPrefillCharge = false, false
	return req
}

// PreferAggregated is the mixed-fleet choice: when model has aggregated
// workers beside its prefill and decode ones, a request goes whole to the
// aggregated pool while its workers carry no more open requests each than
// the decode workers (where a disaggregated request spends its life).
// False when either pool is empty.
func (r *Router) PreferAggregated(model string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	per := func(role kv.Role) (float64, bool) {
		p := r.pools[poolKey{model, role}]
		if p == nil || len(p.workers) == 0 {
			return 0, false
		}
		var n int64
		for _, w := range p.workers {
			n += w.load.requests
		}
		return float64(n) / float64(len(p.workers)), true
	}
	agg, ok := per(kv.RoleAggregated)
	if !ok {
		return false
	}
	dec, ok := per(kv.RoleDecode)
	return ok && agg <= dec
}
