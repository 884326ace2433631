package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// fakeView answers the planner's reads as set.
type fakeView struct {
	sizes  PoolSizes
	prefer bool
	choice DisaggChoice
	err    error
}

func (v fakeView) PoolSizes(string) PoolSizes   { return v.sizes }
func (v fakeView) PreferAggregated(string) bool { return v.prefer }
func (v fakeView) PlanDisagg(context.Context, Request, DisaggConfig) (DisaggChoice, error) {
	return v.choice, v.err
}

var pd = PoolSizes{Prefill: 2, Decode: 2}

func start(v PlanView) (*LegPlan, Step) {
	l := NewLegPlan(Request{Model: "m", Tokens: prompt(1, 40)}, DisaggConfig{})
	return &l, l.Start(context.Background(), v)
}

func TestLegPlanStart(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    fakeView
		want Step
	}{
		{"aggregated only", fakeView{sizes: PoolSizes{Agg: 2}}, Step{Do: ActRoute, Leg: kv.LegWhole, Path: PathAggregated}},
		{"nothing yet", fakeView{}, Step{Do: ActRoute, Leg: kv.LegWhole, Path: PathAggregated}},
		{"mixed, aggregated less loaded", fakeView{sizes: PoolSizes{Agg: 1, Prefill: 1, Decode: 1}, prefer: true}, Step{Do: ActRoute, Leg: kv.LegWhole, Path: PathAggregated}},
		{"mixed, decode pool fails", fakeView{sizes: PoolSizes{Agg: 1, Prefill: 1, Decode: 1}, err: kv.ErrNoWorkers}, Step{Do: ActRoute, Leg: kv.LegWhole, Path: PathAggregated}},
		{"short prompt", fakeView{sizes: pd, choice: DisaggChoice{Path: PathLocalPrefill, Reason: ReasonISL}}, Step{Do: ActRoute, Leg: kv.LegWhole, Path: PathLocalPrefill, Reason: ReasonISL}},
		{"disagg", fakeView{sizes: pd, choice: DisaggChoice{Path: PathDisagg}}, Step{Do: ActRoute, Leg: kv.LegPrefill, Path: PathDisagg}},
	} {
		_, s := start(tc.v)
		if s.Do != tc.want.Do || s.Leg != tc.want.Leg || s.Path != tc.want.Path || s.Reason != tc.want.Reason {
			t.Errorf("%s: %+v, want %+v", tc.name, s, tc.want)
		}
	}
	// The leg requests have their pool's shape.
	if _, s := start(fakeView{sizes: pd, choice: DisaggChoice{Path: PathLocalPrefill}}); s.Req.Role != kv.RoleDecode || s.Req.NoOverlapCredit || s.Req.NoPrefillCharge {
		t.Errorf("local prefill request %+v", s.Req)
	}
	if _, s := start(fakeView{sizes: pd}); s.Req.Role != kv.RolePrefill || s.Req.NoOverlapCredit {
		t.Errorf("prefill leg request %+v", s.Req)
	}
}

func TestLegPlanStartFails(t *testing.T) {
	_, s := start(fakeView{sizes: PoolSizes{Prefill: 2}})
	if s.Do != ActFail || s.RouterErr || !errors.Is(s.Err, kv.ErrNoWorkers) || !strings.Contains(s.Err.Error(), "2 prefill workers but no decode workers") {
		t.Errorf("half a P/D pool: %+v", s)
	}
	busy := &kv.BusyError{Model: "m", Workers: 2}
	if _, s := start(fakeView{sizes: pd, err: busy}); s.Do != ActFail || !s.RouterErr || s.Err != busy {
		t.Errorf("decode pool busy: %+v", s)
	}
	// With a router queue the request goes on to its prefill leg (which
	// waits for a prefill worker when that pool is busy too); other
	// failures still fail.
	l := NewLegPlan(Request{Model: "m", Tokens: prompt(1, 40)}, DisaggConfig{})
	l.Queue = true
	if s := l.Start(context.Background(), fakeView{sizes: pd, err: busy}); s.Do != ActRoute || s.Leg != kv.LegPrefill || s.Req.Role != kv.RolePrefill {
		t.Errorf("queued, decode pool busy: %+v", s)
	}
	if s := l.Start(context.Background(), fakeView{sizes: pd, err: kv.ErrNoWorkers}); s.Do != ActFail || !errors.Is(s.Err, kv.ErrNoWorkers) {
		t.Errorf("queued, decode pool gone: %+v", s)
	}
}

// A prefill leg: answered with more to do is a decode leg, answered whole
// ends the request.
func TestLegPlanLegs(t *testing.T) {
	l, _ := start(fakeView{sizes: pd})
	s := l.Answered(false)
	if s.Do != ActRoute || s.Leg != kv.LegDecode || s.Req.Role != kv.RoleDecode || !s.Req.NoOverlapCredit || !s.Req.NoPrefillCharge {
		t.Fatalf("after the prefill: %+v", s)
	}
	if s = l.Answered(false); s.Do != ActDone || s.Path != PathDisagg {
		t.Fatalf("after the decode: %+v", s)
	}
	l, _ = start(fakeView{sizes: pd})
	if s := l.Answered(true); s.Do != ActDone {
		t.Fatalf("a final prefill answer: %+v", s)
	}
	lost := fmt.Errorf("x: %w", kv.ErrWorkerLost)
	l, _ = start(fakeView{sizes: pd})
	l.Answered(false)
	if s := l.Lost(key(3), lost); s.Do != ActFail || s.Err != lost {
		t.Fatalf("a lost decode leg: %+v", s)
	}
}

// Lost prefill workers are excluded and the leg retried, up to
// MaxPrefillTries; then, or when no prefill worker is left, the decode
// worker prefills itself. A busy prefill pool falls back at once.
func TestLegPlanPrefillRetries(t *testing.T) {
	lost := kv.ErrWorkerLost
	l, _ := start(fakeView{sizes: pd})
	var s Step
	for i := range MaxPrefillTries - 1 {
		s = l.Lost(key(uint64(i+1)), lost)
		if s.Leg != kv.LegPrefill || !s.Retry || len(s.Req.Exclude) != i+1 || !slices.Contains(s.Req.Exclude, key(uint64(i+1))) {
			t.Fatalf("retry %d: %+v", i+1, s)
		}
	}
	if s = l.Lost(key(9), lost); s.Leg != kv.LegWhole || s.Path != PathLocalPrefill || s.Reason != ReasonPrefillFailed || len(s.Req.Exclude) != 0 {
		t.Fatalf("after %d lost: %+v", MaxPrefillTries, s)
	}

	l, _ = start(fakeView{sizes: pd})
	l.Lost(key(1), lost)
	if s = l.RouteFailed(kv.ErrNoWorkers); s.Reason != ReasonPrefillFailed || !errors.Is(l.Fallback(), ErrPrefillExhausted) {
		t.Fatalf("none left after a loss: %+v", s)
	}
	l, _ = start(fakeView{sizes: pd})
	if s = l.RouteFailed(kv.ErrNoWorkers); s.Do != ActFail || !s.RouterErr {
		t.Fatalf("no prefill worker at all: %+v", s)
	}

	busy := &kv.BusyError{Model: "m", Workers: 2, RetryAfter: time.Second}
	l, _ = start(fakeView{sizes: pd})
	if s = l.RouteFailed(busy); s.Leg != kv.LegWhole || s.Reason != ReasonPrefillBusy {
		t.Fatalf("prefill pool busy: %+v", s)
	}
	// With no decode worker able to prefill alone, the fallback fails as
	// the prefill pool did.
	s = l.RouteFailed(fmt.Errorf("%w: %w", kv.ErrNoWorkers, ErrDecodeOnly))
	var be *kv.BusyError
	if s.Do != ActFail || s.RouterErr || !errors.As(s.Err, &be) || be.RetryAfter != time.Second {
		t.Fatalf("busy fallback to decode-only workers: %+v", s)
	}
}
