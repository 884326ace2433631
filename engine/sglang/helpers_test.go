package sglang

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/engine/enginetest"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/events"
	"github.com/kvmesh/kvmesh/mockengine"
)

const testModel = "mock-model"

type mockOpts struct {
	events      bool
	incremental bool
	mode        string  // disaggregation mode; "" null
	speed       float64 // sim speedup ratio; 0 unthrottled
	dp          int
}

// startMock runs an SGLang stand-in on loopback (16-token pages); it stops
// at cleanup.
func startMock(t *testing.T, o mockOpts) (*mockengine.SGLang, *httptest.Server) {
	t.Helper()
	sc := sim.DefaultConfig()
	sc.Model, sc.BlockSize, sc.Blocks, sc.SpeedupRatio, sc.DPSize = testModel, 16, 512, o.speed, max(o.dp, 1)
	cfg := mockengine.SGLangConfig{Sim: sc, Incremental: o.incremental, DisaggMode: o.mode, LeaseDuration: 5 * time.Second,
		BootstrapTimeout: 3 * time.Second, Logger: slog.New(slog.DiscardHandler)}
	if o.events {
		cfg.Events = &mockengine.EventsConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", BindMode: events.Bind}
	}
	s, err := mockengine.NewSGLang(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, enginetest.Serve(t, s.Handler(), s)
}

func newEngine(t *testing.T, cfg Config) *Engine {
	t.Helper()
	if cfg.StatsInterval == 0 {
		cfg.StatsInterval = 20 * time.Millisecond
	}
	return enginetest.Open(t, func(ctx context.Context) (*Engine, error) { return New(ctx, cfg) })
}
