package main

import (
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/natsbus/natstest"
)

// kvmesh frontend → `kvmesh worker --engine vllm --role prefill|decode` →
// two `kvmesh mock-engine vllm` with the NixlConnector contract: the
// prefill leg's kv_transfer_params reach the decode mock whole, it pulls
// the blocks from the prefill mock's side channel and notifies it.
func TestVLLMDisaggregatedE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ns := natstest.Start(t)
	pre := startMockVLLM(t, "prefill mock", "--speedup-ratio", "0", "--kv-role", "kv_producer", "--side-channel-port", "0")
	dec := startMockVLLM(t, "decode mock", "--speedup-ratio", "0", "--kv-role", "kv_consumer", "--side-channel-port", "0")
	pre.startWorker(t, "prefill worker", ns.URL(), "--role", "prefill", "--model", "mock-model")
	dec.startWorker(t, "decode worker", ns.URL(), "--role", "decode", "--model", "mock-model")
	base := startFrontendProc(t, ns.URL(), "--disagg-local-prefill-tokens", "0")
	watchWorkers(t, ns.URL(), "mock-model", 2)
	var st int
	var c completion
	testutil.WaitFor(t, 20*time.Second, "a P/D answer", func() bool {
		st, c = completeOnce(t, base, map[string]any{"model": "mock-model", "prompt": tokenPrompt(20*16+5, 4000), "max_tokens": 12})
		return st == 200
	})
	if c.Usage.CompletionTokens != 12 {
		t.Fatalf("P/D completion %+v", c)
	}
	if n := pre.metric(t, "vllm:prompt_tokens_total"); n == 0 {
		t.Fatalf("the prefill mock computed nothing")
	}
	// The decode mock pulled the 20 full blocks rather than computing them.
	if n := dec.metric(t, "vllm:prefix_cache_hits_total"); n < 20*16 {
		t.Fatalf("decode mock cached %v tokens, want the 320 pulled", n)
	}
}
