package fleet

import (
	"log/slog"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/frontend"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/worker"
)

// Config.TierLoad (--router-tier-load-ms, or serve's KVBM bandwidths)
// reaches every worker the router learns from discovery, so the time cost
// prices its tiers by their load.
func TestTierLoadReachesTheRouter(t *testing.T) {
	ctx, nc, disc := controlPlane(t, 2*time.Second)
	model, err := frontend.BuiltinModel(sim.DefaultConfig().Model)
	if err != nil {
		t.Fatal(err)
	}
	load, err := router.ParseTierLoad("host=0.5,disk=2")
	if err != nil {
		t.Fatal(err)
	}
	cl, err := New(ctx, Config{NC: nc, Discovery: disc, Models: []string{model.Name}, TierLoad: load,
		Router: router.Config{Mode: router.ModeKV}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	cfg := sim.DefaultConfig()
	cfg.Blocks, cfg.SpeedupRatio = 128, 0
	eng, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	startWorker(t, ctx, nc, eng, worker.Config{LoadInterval: 20 * time.Millisecond})
	testutil.WaitFor(t, 10*time.Second, "the worker routable", func() bool {
		return len(cl.router.Workers(model.Name, kv.RoleAggregated)) == 1
	})
	got := cl.router.Workers(model.Name, kv.RoleAggregated)[0].TierLoad
	if got != load || got[kv.TierHost] != 0.5 || got[kv.TierDisk] != 2 {
		t.Fatalf("worker's tier load %v, want %v", got, load)
	}
}
