package worker

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
)

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
