package router_test

import (
	"math"
	"testing"

	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/router"
)

// The router keeps its own copy of the sim's timing model (it may not
// import engines); this pins the copy to the original.
func TestDefaultEngineTimingMatchesSim(t *testing.T) {
	tm := router.DefaultEngineTiming()
	for _, x := range []int{0, 1, 64, 1000, 8192, 20000, 131072} {
		if got, want := tm.PrefillMS(float64(x)), sim.PrefillMS(x); math.Abs(got-want) > 1e-9*max(1, want) {
			t.Errorf("PrefillMS(%d) = %v, sim %v", x, got, want)
		}
	}
	for _, p := range []float64{-0.5, 0, 0.01, 0.3, 0.77, 1, 2} {
		if got, want := tm.DecodeMS(p), sim.DecodeMS(p); math.Abs(got-want) > 1e-9 {
			t.Errorf("DecodeMS(%v) = %v, sim %v", p, got, want)
		}
	}
	if sim.DefaultMaxBatchedTokens != 8192 {
		t.Errorf("sim's pass budget is %d; the router assumes 8192 for workers that report none", sim.DefaultMaxBatchedTokens)
	}
}
