package fleet

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/enginetest"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/frontend"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/worker"
)

// takeOne is the one request eng recorded since the last call.
func takeOne(t *testing.T, eng *enginetest.Recorder) engine.Request {
	t.Helper()
	reqs := eng.Take()
	if len(reqs) != 1 {
		t.Fatalf("the engine got %d requests, want 1", len(reqs))
	}
	return reqs[0]
}

// The sampling parameters a client sends travel frontend → Cluster →
// gRPC → worker → engine.Request intact; the ones it leaves out arrive
// unset (top_p 0, no penalties), never as a value the frontend made up.
func TestSamplingParamsReachEngine(t *testing.T) {
	ctx, nc, disc := controlPlane(t, 2*time.Second)
	cfg := sim.DefaultConfig()
	cfg.BlockSize, cfg.Blocks, cfg.SpeedupRatio = 16, 128, 0
	se, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	eng := &enginetest.Recorder{Engine: se}
	startWorker(t, ctx, nc, eng, worker.Config{LoadInterval: 20 * time.Millisecond})
	reg := prometheus.NewRegistry()
	cl, model := startCluster(t, ctx, nc, disc, reg)
	waitFor(t, 10*time.Second, "the worker routed", func() bool {
		return len(cl.router.Workers(model.Name, kv.RoleAggregated)) == 1
	})
	ts := httptest.NewServer(frontend.New(frontend.DefaultConfig(), cl, servedModels(model), reg, reg))
	t.Cleanup(func() { ts.Close(); http.DefaultClient.CloseIdleConnections() })

	type sampling struct {
		MaxTokens                              int
		Seed                                   uint64
		Temperature, TopP, Presence, Frequency float64
	}
	of := func(r engine.Request) sampling {
		return sampling{r.MaxTokens, r.Seed, r.Temperature, r.TopP, r.PresencePenalty, r.FrequencyPenalty}
	}
	for _, tc := range []struct {
		name, path, params string
		want               sampling
		anySeed            bool // the client sent none: the frontend picks one
	}{
		{"chat, all set", "/v1/chat/completions",
			`"max_tokens":3,"seed":-2,"temperature":0.25,"top_p":0.125,"presence_penalty":-1.5,"frequency_penalty":1.75`,
			sampling{3, 1<<64 - 2, 0.25, 0.125, -1.5, 1.75}, false},
		{"completions, all set", "/v1/completions",
			`"max_tokens":2,"seed":9,"temperature":0,"top_p":1,"presence_penalty":2,"frequency_penalty":-2`,
			sampling{2, 9, 0, 1, 2, -2}, false},
		// Temperature has no unset form on the wire: the OpenAI default, 1.
		{"chat, defaults", "/v1/chat/completions", `"max_tokens":1`, sampling{MaxTokens: 1, Temperature: 1}, true},
		{"completions, nulls", "/v1/completions",
			`"max_tokens":1,"top_p":null,"presence_penalty":null,"frequency_penalty":null`,
			sampling{MaxTokens: 1, Temperature: 1}, true},
	} {
		body := `{"model":"` + model.Name + `",` + tc.params + `,`
		if tc.path == "/v1/completions" {
			body += `"prompt":"the sampling parameters arrive"}`
		} else {
			body += `"messages":[{"role":"user","content":"the sampling parameters arrive"}]}`
		}
		resp, out := post(t, ts.URL+tc.path, body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", tc.name, resp.StatusCode, out)
		}
		got := of(takeOne(t, eng))
		if tc.anySeed {
			got.Seed = 0
		}
		if got != tc.want {
			t.Errorf("%s: engine got %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
