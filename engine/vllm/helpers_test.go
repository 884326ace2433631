package vllm

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
	events bool
	role   string  // NixlConnector kv_role; "" off
	speed  float64 // sim speedup ratio; 0 unthrottled
	loras  []string
}

// startMock runs a vLLM stand-in on loopback (unthrottled sim, 16-token
// blocks); it stops at cleanup.
func startMock(t *testing.T, o mockOpts) (*mockengine.VLLM, *httptest.Server) {
	t.Helper()
	sc := sim.DefaultConfig()
	sc.Model, sc.BlockSize, sc.Blocks, sc.SpeedupRatio = testModel, 16, 512, o.speed
	cfg := mockengine.VLLMConfig{Sim: sc, EnablePromptTokensDetails: true, LoRAs: o.loras, Logger: slog.New(slog.DiscardHandler)}
	if o.events {
		cfg.Events = &mockengine.EventsConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0",
			BindMode: events.Bind, Shape: events.ShapeMap}
	}
	if o.role != "" {
		cfg.KVTransfer = &mockengine.KVTransferConfig{Role: o.role, SideChannelHost: "127.0.0.1", LeaseDuration: 5 * time.Second}
	}
	v, err := mockengine.NewVLLM(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return v, enginetest.Serve(t, v.Handler(), v)
}

func newEngine(t *testing.T, cfg Config) *Engine {
	t.Helper()
	if cfg.StatsInterval == 0 {
		cfg.StatsInterval = 20 * time.Millisecond
	}
	return enginetest.Open(t, func(ctx context.Context) (*Engine, error) { return New(ctx, cfg) })
}
