package worker

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
)

// Two workers share a registry; each counts its own requests by result,
// its in-flight streams, hints and published events, and Close removes
// its series.
func TestWorkerMetrics(t *testing.T) {
	_, nc := startNATS(t)
	reg := prometheus.NewRegistry()
	start := func(id uint64, eng *testEngine) (*Worker, api.WorkerClient) {
		return startWorkerWith(t, nc, eng, Config{InstanceID: id, Registerer: reg})
	}
	eng := &testEngine{tick: time.Millisecond}
	w1, c1 := start(0xa1, eng)
	w2, _ := start(0xa2, &testEngine{tick: time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	run := func(req *api.GenerateRequest) error {
		st, err := c1.Generate(ctx, req)
		if err != nil {
			return err
		}
		for {
			if _, err := st.Recv(); err == io.EOF {
				return nil
			} else if err != nil {
				return err
			}
		}
	}
	if err := run(&api.GenerateRequest{Tokens: prompt(1, 10), MaxTokens: 4}); err != nil {
		t.Fatal(err)
	}
	if err := run(&api.GenerateRequest{Tokens: prompt(1, 10), MaxTokens: 2, KvHint: []byte{1}, KvTransferParams: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	if err := run(&api.GenerateRequest{Tokens: prompt(1, 10)}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("max_tokens 0: %v", err)
	}
	// A stream held open shows in flight; cancelling it counts as canceled.
	eng.tick = 50 * time.Millisecond
	cctx, ccancel := context.WithCancel(ctx)
	st, err := c1.Generate(cctx, &api.GenerateRequest{Tokens: prompt(100, 10), MaxTokens: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	l1 := fmt.Sprintf(`instance="%s",model="m"`, natsbus.InstanceToken(w1.InstanceID()))
	if got := testutil.Metrics(t, reg)["kvmesh_worker_inflight_requests{"+l1+"}"]; got != 1 {
		t.Fatalf("in flight %v, want 1", got)
	}
	ccancel()
	waitMetric(t, reg, `kvmesh_worker_requests_total{`+l1+`,result="canceled"}`, 1)

	got := testutil.Metrics(t, reg)
	_, events, _ := w1.pub.Counts()
	for k, v := range map[string]float64{
		`kvmesh_worker_requests_total{` + l1 + `,result="finished"}`:                         2,
		`kvmesh_worker_requests_total{` + l1 + `,result="rejected"}`:                         1,
		`kvmesh_worker_requests_total{` + l1 + `,result="error"}`:                            0,
		`kvmesh_worker_inflight_requests{` + l1 + `}`:                                        0,
		`kvmesh_worker_kv_hints_total{` + l1 + `}`:                                           1,
		`kvmesh_worker_kv_hint_envelopes_dropped_total{` + l1 + `,reason="malformed"}`:       1,
		`kvmesh_worker_kv_hint_envelopes_dropped_total{` + l1 + `,reason="ignored_version"}`: 0,
		`kvmesh_worker_kv_transfer_params_total{` + l1 + `}`:                                 1,
		`kvmesh_worker_prompt_tokens_total{` + l1 + `}`:                                      20,
		`kvmesh_worker_events_published_total{` + l1 + `}`:                                   float64(events),
	} {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	if events == 0 {
		t.Error("no events published")
	}
	if got[`kvmesh_worker_output_tokens_total{`+l1+`}`] < 6 {
		t.Errorf("output tokens %v, want ≥ 6", got[`kvmesh_worker_output_tokens_total{`+l1+`}`])
	}
	l2 := fmt.Sprintf(`instance="%s",model="m"`, natsbus.InstanceToken(w2.InstanceID()))
	if g := got[`kvmesh_worker_requests_total{`+l2+`,result="finished"}`]; g != 0 {
		t.Errorf("second worker counted %v requests", g)
	}
	if g, ok := got[`kvmesh_worker_kv_hint_envelopes_dropped_total{`+l2+`,reason="malformed"}`]; !ok || g != 0 {
		t.Errorf("second worker counted %v malformed hints (present %v), want its own 0", g, ok)
	}
	w1.Close()
	for k := range testutil.Metrics(t, reg) {
		if strings.Contains(k, l1) {
			t.Fatalf("%s still registered after Close", k)
		}
	}
	// A worker whose series are already registered does not start.
	dup, err := New(Config{InstanceID: 0xa2, Registerer: reg}, &testEngine{tick: time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dup.Close()
	if err := dup.Start(ctx); err == nil || !strings.Contains(err.Error(), "metrics") {
		t.Fatalf("duplicate instance started: %v", err)
	}
}

// On an engine that reports no use (no Peer, like the vLLM and SGLang
// adapters) every hinted request still ends in one outcome: delivered once
// the engine accepted the request carrying it, dropped where the worker
// refused the hint, failed when the request ended before the engine took it.
func TestHintOutcomesWithoutPeer(t *testing.T) {
	_, nc := startNATS(t)
	reg := prometheus.NewRegistry()
	w, c := startWorkerWith(t, nc, &testEngine{tick: time.Millisecond}, Config{InstanceID: 0xb1, Registerer: reg})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	run := func(req *api.GenerateRequest) {
		st, err := c.Generate(ctx, req)
		for err == nil {
			_, err = st.Recv()
		}
		if err != io.EOF {
			t.Logf("request %s: %v", req.RequestId, err)
		}
	}
	valid := api.HintToProto(&kv.Hint{ID: "h", Endpoint: "tcp://127.0.0.1:7", Hashes: []kv.EngineHash{1, 2}})
	run(&api.GenerateRequest{RequestId: "delivered", Tokens: prompt(1, 9), MaxTokens: 2, KvFetch: valid})
	run(&api.GenerateRequest{RequestId: "malformed", Tokens: prompt(1, 9), MaxTokens: 2, KvHint: []byte{1}})
	run(&api.GenerateRequest{RequestId: "rejected", Tokens: prompt(1, 9), KvFetch: valid}) // max_tokens 0
	l := fmt.Sprintf(`instance="%s",model="m"`, natsbus.InstanceToken(w.InstanceID()))
	want := map[string]float64{
		`outcome="delivered",reason="lowered"`:    1,
		`outcome="dropped",reason="malformed"`:    1,
		`outcome="failed",reason="request_ended"`: 1,
		`outcome="delivered",reason="unused"`:     0,
		`outcome="dropped",reason="decode_leg"`:   0,
	}
	got := testutil.Metrics(t, reg)
	var sum float64
	for k, v := range got {
		if strings.HasPrefix(k, "kvmesh_worker_kv_hint_outcomes_total{") {
			sum += v
		}
	}
	for labels, v := range want {
		k := "kvmesh_worker_kv_hint_outcomes_total{" + l + "," + labels + "}"
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	if hinted := got["kvmesh_worker_kv_hints_total{"+l+"}"]; hinted != 3 || sum != hinted {
		t.Errorf("%v hinted requests, %v outcomes; want 3 of each", hinted, sum)
	}
}

func waitMetric(t *testing.T, reg *prometheus.Registry, key string, want float64) {
	t.Helper()
	testutil.WaitFor(t, 5*time.Second, fmt.Sprintf("%s = %v", key, want), func() bool { return testutil.Metrics(t, reg)[key] == want },
		func() string { return fmt.Sprint(testutil.Metrics(t, reg)[key]) })
}
