package bench

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// The online ladder: a step per speedup, ascending, each with prompts of
// its own; its table reads the server's reachable prefix and router queue
// wait from what /metrics moved by during the step, and its capacity line
// is the highest speedup within the SLO.
func TestLoadLadder(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := newFake(t, func(int) fakeReply { return fakeReply{tokens: 2} })
	// A kvmesh server's series, moving with every request: 100 prompt
	// tokens routed, 40 reachable, 30 routed, half of them waiting 10 ms.
	f.metrics = func() string {
		n := f.n.Load()
		return fmt.Sprintf(`# TYPE kvmesh_router_isl_tokens_total counter
kvmesh_router_isl_tokens_total %d
# TYPE kvmesh_router_prefix_tokens_total counter
kvmesh_router_prefix_tokens_total{kind="reachable",model="m"} %d
kvmesh_router_prefix_tokens_total{kind="routed",model="m"} %d
# TYPE kvmesh_router_queue_seconds histogram
kvmesh_router_queue_seconds_bucket{model="m",le="+Inf"} %d
kvmesh_router_queue_seconds_sum{model="m"} %g
kvmesh_router_queue_seconds_count{model="m"} %d
`, 100*n, 40*n, 30*n, n/2, 0.01*float64(n/2), n/2)
	}
	path := writeTrace(t,
		`{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}`,
		`{"timestamp": 10, "input_length": 700, "output_length": 3, "hash_ids": [1, 3]}`,
		`{"timestamp": 20, "input_length": 100, "output_length": 2, "hash_ids": [4]}`,
		`{"timestamp": 30, "input_length": 100, "output_length": 2, "hash_ids": [4]}`,
	)
	var progress bytes.Buffer
	l, err := RunLoadLadder(context.Background(), LoadConfig{URL: f.url(), Model: "m", TracePath: path}, []float64{1, 2}, "kv+queue", 60000, &progress)
	if err != nil {
		t.Fatal(err)
	}
	f.srv.Close()
	if len(l.Steps) != 2 || l.Steps[0].Speedup != 1 || l.Steps[1].Speedup != 2 || l.Steps[1].Report.OK != 4 {
		t.Fatalf("steps %+v", l.Steps)
	}
	if s := l.Steps[0].Server; !s.OK || s.ISLTokens != 400 || s.Reachable != 160 || s.Routed != 120 || s.QueueWaits != 2 {
		t.Fatalf("server delta of the first step %+v", s)
	}
	// Each step's prompts are its own; within a step a shared hash id is
	// still a shared prefix.
	first := func(i int) string {
		return f.bodies[i]["messages"].([]any)[0].(map[string]any)["content"].(string)
	}
	if first(0) == first(4) || first(0)[:100] != first(1)[:100] || first(4)[:100] != first(5)[:100] {
		t.Fatalf("step prompts: step 1 %.40q / %.40q, step 2 %.40q / %.40q", first(0), first(1), first(4), first(5))
	}
	var out bytes.Buffer
	if err := l.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{"queue wait mean", "kv+queue", "0.4000", "5.0", "load: capacity mode=kv+queue p90_ttft_le_ms=60000 max_speedup=2\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	if strings.Count(progress.String(), "load: speedup=") != 2 {
		t.Errorf("progress %q", progress.String())
	}
	l.SLOMS = 1e-6
	if l.MaxSpeedup() != 0 {
		t.Errorf("max speedup %g under an SLO no step meets, want 0", l.MaxSpeedup())
	}
	if _, err := RunLoadLadder(context.Background(), LoadConfig{URL: f.url(), Model: "m", Synthetic: smallSynth(1, 2, 2)}, []float64{1}, "x", 1000, nil); err == nil {
		t.Error("a synthetic ladder: no error")
	}
}
