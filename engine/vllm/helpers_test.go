package vllm

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/events"
	"github.com/kvmesh/kvmesh/kv"
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
	srv := httptest.NewServer(v.Handler())
	t.Cleanup(func() {
		srv.Close()
		v.Close()
	})
	return v, srv
}

func newEngine(t *testing.T, cfg Config) *Engine {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if cfg.StatsInterval == 0 {
		cfg.StatsInterval = 20 * time.Millisecond
	}
	e, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func prompt(n int, base kv.Token) []kv.Token {
	out := make([]kv.Token, n)
	for i := range out {
		out[i] = base + kv.Token(i)
	}
	return out
}

// collect drains a stream.
func collect(t *testing.T, ch <-chan engine.Chunk) (toks []kv.Token, last engine.Chunk, chunks int) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case c, ok := <-ch:
			if !ok {
				return toks, last, chunks
			}
			chunks++
			toks = append(toks, c.Tokens...)
			last = c
		case <-timeout:
			t.Fatal("stream did not end")
		}
	}
}
