package fleet

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/frontend"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/worker"
)

// controlPlane starts an embedded NATS with a discovery bucket of the given
// TTL for one test, and checks for leaked goroutines after everything the
// test registered with t.Cleanup has run.
func controlPlane(t testing.TB, ttl time.Duration) (context.Context, *nats.Conn, *discovery.Discovery) {
	t.Helper()
	// Registered first, so it runs last.
	t.Cleanup(func() {
		goleak.VerifyNone(t, goleak.IgnoreCurrent(),
			goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*ats).start"))
	})
	srv, err := natsbus.StartEmbedded(natsbus.EmbeddedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := natsbus.Connect(natsbus.ConnConfig{URLs: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	disc, err := discovery.Open(ctx, nc, discovery.Config{TTL: ttl, Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	return ctx, nc, disc
}

// startWorker runs a worker around eng on the test's control plane until
// the test ends; cfg's discovery is the test's in-memory one.
func startWorker(t testing.TB, ctx context.Context, nc *nats.Conn, eng engine.Engine, cfg worker.Config) *worker.Worker {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Discovery = discovery.Config{TTL: 2 * time.Second, Memory: true}
	w, err := worker.New(cfg, eng, nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

// startCluster runs a KV-mode Cluster for the sim's built-in model until
// the test ends, with its metrics in reg.
func startCluster(t *testing.T, ctx context.Context, nc *nats.Conn, disc *discovery.Discovery, reg prometheus.Registerer) (*Cluster, *frontend.Model) {
	t.Helper()
	model, err := frontend.BuiltinModel(sim.DefaultConfig().Model)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := New(ctx, Config{NC: nc, Discovery: disc, Models: []string{model.Name},
		Router: router.Config{Mode: router.ModeKV}, Registerer: reg, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl, model
}
