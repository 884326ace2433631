package twin

import (
	"testing"

	"github.com/kvmesh/kvmesh/router"
)

// TestTimeCostBeatsBlockCost is the cost models' regression check on the
// conversation slice (8 workers, default engine shape): the router's
// default (time) cost must keep beating the DESIGN §5 block cost on both
// prefix hit and mean TTFT, at the trace's rate and at 4× it. Results are
// deterministic, so the margins (about 0.015–0.035 hit and 35–107 ms mean
// TTFT when written) are not noise.
func TestTimeCostBeatsBlockCost(t *testing.T) {
	if router.DefaultCost().Kind != router.CostTime {
		t.Fatalf("default cost kind %q", router.DefaultCost().Kind)
	}
	wl := loadSlice(t)
	blocks := router.BlockCost()
	for _, speedup := range []float64{1, 4} {
		tc := run(t, wl, Config{Mode: string(router.ModeKV), ArrivalSpeedup: speedup})
		bc := run(t, wl, Config{Mode: string(router.ModeKV), ArrivalSpeedup: speedup, Cost: &blocks})
		checkResult(t, tc)
		checkResult(t, bc)
		t.Logf("speedup %g: time hit %.4f TTFT mean %.1f p90 %.1f ms; blocks hit %.4f TTFT mean %.1f p90 %.1f ms",
			speedup, tc.Hit.Total, tc.TTFT.Mean, tc.TTFT.P90, bc.Hit.Total, bc.TTFT.Mean, bc.TTFT.P90)
		if !(tc.Hit.Total > bc.Hit.Total) || !(tc.TTFT.Mean < bc.TTFT.Mean) {
			t.Errorf("speedup %g: time cost hit %.4f mean TTFT %.1f ms vs block cost %.4f, %.1f ms",
				speedup, tc.Hit.Total, tc.TTFT.Mean, bc.Hit.Total, bc.TTFT.Mean)
		}
	}
}
