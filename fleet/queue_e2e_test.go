package fleet

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/frontend"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/worker"
)

// The live queue end to end, in process: frontend → Cluster → queue →
// worker. A booking the test holds keeps the only worker from admitting,
// so requests wait deterministically: two queue, the third gets a 429
// with Retry-After, and once the booking ends the two are served.
func TestLiveQueueThroughFrontend(t *testing.T) {
	ctx, nc, disc := controlPlane(t, 2*time.Second)
	cfg := sim.DefaultConfig()
	cfg.BlockSize, cfg.Blocks, cfg.SpeedupRatio = 16, 512, 0
	eng, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	startWorker(t, ctx, nc, eng, worker.Config{LoadInterval: 20 * time.Millisecond})
	model, err := frontend.BuiltinModel(cfg.Model)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cl, err := New(ctx, Config{NC: nc, Discovery: disc, Models: []string{model.Name}, Registerer: reg,
		Logger: slog.New(slog.DiscardHandler), Queue: &router.QueueConfig{Limit: 2},
		Router: router.Config{Mode: router.ModeKV, Admit: &router.AdmitConfig{PrefillPasses: 1e-9, KVUsage: -1, Waiting: -1}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	waitFor(t, 10*time.Second, "the worker routed", func() bool {
		return len(cl.router.Workers(model.Name, kv.RoleAggregated)) == 1
	})
	ts := httptest.NewServer(frontend.New(frontend.DefaultConfig(), cl, servedModels(model), reg, reg))
	t.Cleanup(func() { ts.Close(); http.DefaultClient.CloseIdleConnections() })

	// The test's own booking: prefill on the only worker, never sent.
	hold, err := cl.router.Route(ctx, router.Request{Model: model.Name, Tokens: make([]kv.Token, 64)})
	if err != nil {
		t.Fatal(err)
	}
	depth := func() int {
		cl.queue.mu.Lock()
		defer cl.queue.mu.Unlock()
		return cl.queue.q.Len()
	}
	post := func(ctx context.Context, i int) (int, string, string) {
		body := fmt.Sprintf(`{"model":%q,"prompt":"queued request %d","max_tokens":3}`, model.Name, i)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/completions", strings.NewReader(body))
		if err != nil {
			t.Error(err)
			return 0, "", ""
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "", err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Retry-After"), string(b)
	}
	type answer struct {
		code int
		body string
	}
	answers := make(chan answer, 3)
	send := func(ctx context.Context, i int) {
		go func() {
			code, _, body := post(ctx, i)
			answers <- answer{code, body}
		}()
	}
	cctx, cancel := context.WithCancel(ctx)
	send(cctx, 0)
	waitFor(t, 10*time.Second, "the first request queued", func() bool { return depth() == 1 })
	send(ctx, 1)
	waitFor(t, 10*time.Second, "the second request queued", func() bool { return depth() == 2 })
	code, retry, body := post(ctx, 2)
	if code != http.StatusTooManyRequests || retry == "" || !strings.Contains(body, "rate_limit_exceeded") {
		t.Fatalf("past the limit: %d Retry-After %q %s, want a 429 with Retry-After", code, retry, body)
	}
	// A cancelled client leaves the queue at once, freeing its slot.
	cancel()
	if a := <-answers; a.code != 0 {
		t.Fatalf("cancelled client got %d %s", a.code, a.body)
	}
	waitFor(t, 10*time.Second, "the cancelled request left", func() bool { return depth() == 1 })
	send(ctx, 3)
	waitFor(t, 10*time.Second, "a request took the freed slot", func() bool { return depth() == 2 })
	hold.Done() // the worker admits again
	for range 2 {
		if a := <-answers; a.code != http.StatusOK {
			t.Fatalf("queued request: %d %s", a.code, a.body)
		}
	}
	if depth() != 0 {
		t.Fatalf("depth %d after every request ended", depth())
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var waited uint64
	for _, f := range fams {
		if f.GetName() == "kvmesh_router_queue_seconds" {
			for _, m := range f.GetMetric() {
				waited += m.GetHistogram().GetSampleCount()
			}
		}
	}
	if waited != 2 {
		t.Fatalf("kvmesh_router_queue_seconds counts %d waits, want 2 (the served ones)", waited)
	}
}

// With P/D the queue holds prefill legs: the decode worker cannot prefill
// alone (decode-only), and a booking the test holds keeps the only
// prefill worker from admitting, so a request waits in the queue instead
// of failing busy (a 503); once the booking ends its prefill leg runs and
// its decode leg follows, with an aggregated engine's answer.
func TestLiveQueuePrefillLeg(t *testing.T) {
	f := startPDWith(t, 1, 1, 0, time.Minute, worker.Config{DecodeOnly: true}, func(c *Config) {
		c.Queue = &router.QueueConfig{}
		c.Router.Admit = &router.AdmitConfig{PrefillPasses: 1e-9, KVUsage: -1, Waiting: -1}
	})
	waitFor(t, 10*time.Second, "the decode worker registered decode-only", func() bool {
		ws := f.c.router.Workers(pdModel, kv.RoleDecode)
		return len(ws) == 1 && ws[0].DecodeOnly
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hold, err := f.c.router.Route(ctx, router.PrefillLegRequest(router.Request{Model: pdModel, Tokens: make([]kv.Token, 64)}))
	if err != nil {
		t.Fatal(err)
	}
	depth := func() int {
		f.c.queue.mu.Lock()
		defer f.c.queue.mu.Unlock()
		return f.c.queue.q.Len()
	}
	toks := prompt(40, 3000)
	res := make(chan pdResult, 1)
	go func() { res <- pdTurn(ctx, f.c, "queued", toks, 6) }()
	waitFor(t, 10*time.Second, "the prefill leg queued", func() bool { return depth() == 1 })
	if got := legsOf(f.prefill, "queued", kv.LegPrefill); len(got) != 0 {
		t.Fatalf("the prefill leg reached the busy prefill worker")
	}
	hold.Done()
	r := <-res
	if r.err != nil || !slices.Equal(r.toks, reference(t, toks, 6)) {
		t.Fatalf("queued request: %+v", r)
	}
	if pre, dec := legsOf(f.prefill, "queued", kv.LegPrefill), legsOf(f.decode, "queued", kv.LegDecode); len(pre) != 1 || len(dec) != 1 {
		t.Fatalf("prefill legs %d, decode legs %d, want 1 each", len(pre), len(dec))
	}
	if n := testutil.Value(t, f.reg, "kvmesh_router_queue_seconds_count"); n != 1 {
		t.Errorf("queue waits counted %v, want 1", n)
	}
}
