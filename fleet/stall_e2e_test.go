package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/frontend"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/worker"
	"github.com/kvmesh/kvmesh/workerclient"
)

// stallTrap, once armed, makes the first engine that streams stallAfter
// chunks of one request hang for good: none of its streams emits again,
// while the engine, its worker process and its discovery record live on.
type stallTrap struct {
	armed      atomic.Bool
	stallAfter int
}

// hangingEngine is an engine that can hang (see stallTrap). Its goroutines
// end with their request's context, so nothing leaks.
type hangingEngine struct {
	engine.Engine
	trap *stallTrap
	hung atomic.Bool
}

func (e *hangingEngine) Generate(ctx context.Context, req *engine.Request) (<-chan engine.Chunk, error) {
	in, err := e.Engine.Generate(ctx, req)
	if err != nil {
		return nil, err
	}
	out := make(chan engine.Chunk)
	go func() {
		defer close(out)
		for n := 0; ; n++ {
			if n == e.trap.stallAfter && e.trap.armed.CompareAndSwap(true, false) {
				e.hung.Store(true)
			}
			if e.hung.Load() {
				<-ctx.Done()
				return
			}
			var c engine.Chunk
			var ok bool
			select {
			case c, ok = <-in:
				if !ok {
					return
				}
			case <-ctx.Done():
				return
			}
			select {
			case out <- c:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// An engine that hangs mid-stream while its worker stays alive: the
// worker's watchdog fails the stream, the frontend migrates it, and the
// client gets exactly the text and token count of an undisturbed run; the
// hung worker leaves discovery and the router.
func TestStalledWorkerMigrates(t *testing.T) { testStalledWorkerMigrates(t, false) }

// The same with the workers in process (serve's wiring): the frontend's
// goroutine waits on the engine in the worker's relay, where the stall
// must reach it just the same.
func TestStalledLocalWorkerMigrates(t *testing.T) { testStalledWorkerMigrates(t, true) }

func testStalledWorkerMigrates(t *testing.T, local bool) {
	const stallTimeout = 300 * time.Millisecond
	ctx, nc, disc := controlPlane(t, 2*time.Second)
	trap := &stallTrap{stallAfter: 5}
	var engines []*hangingEngine
	var workers []*worker.Worker
	for range 2 {
		cfg := sim.DefaultConfig()
		eng, err := sim.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		he := &hangingEngine{Engine: eng, trap: trap}
		w := startWorker(t, ctx, nc, he, worker.Config{StallTimeout: stallTimeout})
		engines, workers = append(engines, he), append(workers, w)
	}
	reg := prometheus.NewRegistry()
	var cl *Cluster
	var model *frontend.Model
	if !local {
		cl, model = startCluster(t, ctx, nc, disc, reg)
	} else {
		var locals []workerclient.Local
		for _, w := range workers {
			locals = append(locals, w.Local())
		}
		var err error
		if model, err = frontend.BuiltinModel(sim.DefaultConfig().Model); err != nil {
			t.Fatal(err)
		}
		cl, err = New(ctx, Config{NC: nc, Discovery: disc, Models: []string{model.Name}, Local: locals,
			Router: router.Config{Mode: router.ModeKV}, Registerer: reg, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
	}
	ts := httptest.NewServer(frontend.New(frontend.DefaultConfig(), cl, servedModels(model), reg, reg))
	t.Cleanup(func() { ts.Close(); http.DefaultClient.CloseIdleConnections() })
	routedIDs := func() map[uint64]bool {
		out := map[uint64]bool{}
		for _, wi := range cl.router.Workers(model.Name, kv.RoleAggregated) {
			out[wi.Key.Instance] = true
		}
		return out
	}
	waitFor(t, 10*time.Second, "two workers routed", func() bool { return len(routedIDs()) == 2 })

	const maxTokens = 80
	chat := func() (text string, finish any, completion float64) {
		t.Helper()
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"Tell me about hung engines."}],"stream":true,`+
			`"stream_options":{"include_usage":true},"seed":4242,"max_tokens":%d}`, model.Name, maxTokens)
		// Bounded, so a stream that hangs fails the test instead of hanging it.
		rctx, cancel := context.WithTimeout(ctx, 8*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(rctx, http.MethodPost, ts.URL+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		events, done := sseEvents(t, resp.Body)
		if !done || len(events) == 0 {
			t.Fatalf("stream not finished: done %v, %d events", done, len(events))
		}
		text, finish = chatDeltas(events)
		if u, ok := events[len(events)-1]["usage"].(map[string]any); ok {
			completion, _ = u["completion_tokens"].(float64)
		}
		return text, finish, completion
	}

	refText, refFinish, refTokens := chat()
	if refFinish != "length" || refTokens != maxTokens || refText == "" {
		t.Fatalf("undisturbed run: finish %v, %v tokens, text %q", refFinish, refTokens, refText)
	}

	trap.armed.Store(true)
	start := time.Now()
	text, finish, tokens := chat()
	took := time.Since(start)
	if trap.armed.Load() {
		t.Fatal("the trap never sprang: no engine hung")
	}
	if text != refText || finish != "length" || tokens != maxTokens {
		t.Fatalf("after the stall: finish %v, %v tokens, text %q; undisturbed: %q", finish, tokens, text, refText)
	}
	if m := gatherMetrics(t, reg)["kvmesh_frontend_migrations_total"]; m != 1 {
		t.Fatalf("migrations %v, want 1", m)
	}
	var hung *worker.Worker
	for i, e := range engines {
		if e.hung.Load() {
			hung = workers[i]
		}
		if workers[i].Stalled() != e.hung.Load() {
			t.Fatalf("worker %d: engine hung %v, worker stalled %v", i, e.hung.Load(), workers[i].Stalled())
		}
	}
	t.Logf("stalled stream completed through migration in %v (stall timeout %v)", took.Round(time.Millisecond), stallTimeout)
	if took > stallTimeout+5*time.Second {
		t.Fatalf("took %v", took)
	}
	waitFor(t, 15*time.Second, "hung worker gone from the router", func() bool {
		ids := routedIDs()
		return len(ids) == 1 && !ids[hung.InstanceID()]
	})
	wt, err := disc.Watch(ctx, model.Name, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer wt.Close()
	<-wt.Synced()
	if ins := wt.Instances(); len(ins) != 1 || ins[0].ID == hung.InstanceID() {
		t.Fatalf("discovery still lists %v (hung %x)", ins, hung.InstanceID())
	}
	// New requests go to the healthy worker.
	if text, finish, tokens := chat(); text != refText || finish != "length" || tokens != maxTokens {
		t.Fatalf("after the hung worker left: finish %v, %v tokens", finish, tokens)
	}
}
