package bench

import (
	"math"
	"testing"

	"github.com/kvmesh/kvmesh/internal/stages"
)

func TestMetricsURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://h:1/v1":  "http://h:1/metrics",
		"http://h:1/v1/": "http://h:1/metrics",
		"http://h:1":     "http://h:1/metrics",
	} {
		if got := metricsURL(in); got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
}

// Rows come in path order, only for stages observed, with quantiles in ms.
func TestStageRows(t *testing.T) {
	inf := math.Inf(1)
	s := stages.Snapshot{
		"tokenize":  {Upper: []float64{0.001, 0.002, inf}, Count: []uint64{0, 10, 10}},
		"read_body": {Upper: []float64{0.001, inf}, Count: []uint64{4, 4}},
		"route":     {Upper: []float64{0.001, inf}, Count: []uint64{0, 0}},
		"bogus":     {Upper: []float64{0.001, inf}, Count: []uint64{1, 1}},
	}
	rows := stageRows(s)
	if len(rows) != 2 || rows[0].Stage != "read_body" || rows[1].Stage != "tokenize" {
		t.Fatalf("rows %+v, want read_body then tokenize", rows)
	}
	if r := rows[1]; r.Count != 10 || math.Abs(r.P50ms-1.5) > 1e-9 || math.Abs(r.P99ms-1.99) > 1e-9 {
		t.Fatalf("tokenize %+v, want p50 1.5 ms, p99 1.99 ms", r)
	}
}
