package fleet

import (
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/worker"
	"github.com/kvmesh/kvmesh/workerclient"
)

// countedService counts the Generate calls that reach a worker in process.
type countedService struct {
	api.WorkerServer
	calls atomic.Int64
}

func (s *countedService) Generate(req *api.GenerateRequest, st api.Worker_GenerateServer) error {
	s.calls.Add(1)
	return s.WorkerServer.Generate(req, st)
}

// TestLocalWorkersSkipGRPC runs the same requests through two clusters in
// front of one token-guarded worker: one reaches it over gRPC with proofs,
// the other (serve's wiring) calls it in process. Both answer alike, and
// the in-process one reaches the worker only through its service.
func TestLocalWorkersSkipGRPC(t *testing.T) {
	ctx, nc, disc := controlPlane(t, 2*time.Second)
	const token = "local-test-token"
	cfg := sim.DefaultConfig()
	cfg.SpeedupRatio = 0
	eng, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w := startWorker(t, ctx, nc, eng, worker.Config{FleetToken: token})
	local := w.Local()
	svc := &countedService{WorkerServer: local.Service}
	local.Service = svc

	run := func(name string, locals []workerclient.Local) []genResult {
		c, err := New(ctx, Config{NC: nc, Discovery: disc, Models: []string{cfg.Model}, FleetToken: token, Local: locals,
			Router: router.Config{Mode: router.ModeKV}, Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		waitFor(t, 10*time.Second, name+" sees the worker", func() bool { return len(c.router.Workers(cfg.Model, kv.RoleAggregated)) == 1 })
		var out []genResult
		for i := range 3 {
			r, err := generate(ctx, c, cfg.Model, prompt(uint64(i), 100+50*i), 5+i)
			if err != nil {
				t.Fatalf("%s, request %d: %v", name, i, err)
			}
			out = append(out, r)
		}
		return out
	}
	viaGRPC := run("grpc", nil)
	if n := svc.calls.Load(); n != 0 {
		t.Fatalf("the gRPC cluster's requests reached the in-process service %d times", n)
	}
	inProc := run("local", []workerclient.Local{local})
	if n := svc.calls.Load(); n != 3 {
		t.Fatalf("the in-process cluster's requests reached the service %d times, want 3", n)
	}
	for i := range viaGRPC {
		g, l := viaGRPC[i], inProc[i]
		if g.tokens != l.tokens || g.prompt != l.prompt || g.worker != l.worker {
			t.Errorf("request %d: gRPC %+v, in process %+v", i, g, l)
		}
		if l.cached != l.prompt/cfg.BlockSize*cfg.BlockSize {
			// The second cluster's prompts are the first's: cached whole blocks.
			t.Errorf("request %d in process: %d of %d prompt tokens cached", i, l.cached, l.prompt)
		}
	}
}
