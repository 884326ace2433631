package vllm

import (
	"context"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/enginetest"
	"github.com/kvmesh/kvmesh/engine/remote"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
)

// A request for a LoRA adapter reaches vLLM under the adapter's name, and
// its blocks come back through the relay in the adapter's hash domain (the
// events' lora_name), as the router hashes the request: no block of it
// matches the base model's hashes of the same prompt.
func TestLoRAThroughTheAdapter(t *testing.T) {
	v, srv := startMock(t, mockOpts{events: true, loras: []string{"sql-lora"}})
	e := newEngine(t, Config{Config: remote.Config{URL: srv.URL, Events: v.EventsEndpoint(0), ReplayEvents: v.ReplayEndpoint(0)}})
	s := &sink{stored: map[kv.LocalHash]kv.EngineHash{}}
	e.SetEventSink(s.fn)
	p := enginetest.Prompt(72, 300)
	gen := func(lora string, p []kv.Token) engine.Chunk {
		ch, err := e.Generate(context.Background(), &engine.Request{Tokens: p, LoRA: lora, Sampling: kv.Sampling{MaxTokens: 1}})
		if err != nil {
			t.Fatal(err)
		}
		_, last, _ := enginetest.Collect(t, ch)
		return last
	}
	gen("sql-lora", p)
	want := kv.LocalHashes(nil, p, 16, kv.Seed("sql-lora", ""))
	// Until the subscriber has joined, later batches bring the first
	// through replay.
	i := kv.Token(0)
	testutil.WaitFor(t, 5*time.Second, "sql-lora's blocks in its own domain", func() bool {
		i++
		gen("", enginetest.Prompt(16, 20000+16*i))
		return s.has(want)
	})
	if s.has(kv.LocalHashes(nil, p, 16, kv.Seed("", ""))[:1]) {
		t.Fatal("the adapter's blocks were relayed in the base model's domain")
	}
	if last := gen("", p); last.Usage.CachedTokens != 0 {
		t.Fatalf("the base model found %d of the adapter's tokens cached", last.Usage.CachedTokens)
	}
	if last := gen("sql-lora", p); last.Usage.CachedTokens != 64 {
		t.Fatalf("sql-lora again: %d cached, want 64", last.Usage.CachedTokens)
	}
}
