package router

import (
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

// burstWorkers routes n requests sharing a fresh prefix of prefixLen
// tokens (each with its own short suffix) at once, before any KV event,
// over 8 workers, and returns how many distinct workers got one: each of
// them prefills the prefix.
func burstWorkers(t *testing.T, credit bool, n, prefixLen int) int {
	t.Helper()
	r := newRouter(t, Config{Matcher: newFakeIndex(), CreditRouted: credit}, 1, 2, 3, 4, 5, 6, 7, 8)
	prefix := prompt(42, prefixLen)
	got := map[kv.WorkerKey]bool{}
	for i := range n {
		toks := append(append([]kv.Token(nil), prefix...), prompt(1000+i, 64)...)
		got[route(t, r, toks).Worker] = true
	}
	return len(got)
}

// A burst of 64 requests sharing a fresh 4k-token prefix, sent at once:
// with the routed blocks credited it is prefilled where load requires.
// Load: the time cost spreads a request once the prefill queued on the
// holder costs more than recomputing the prefix on an idle worker. 63 ×
// 64 new tokens behind one 4,160-token prompt is 8,192 tokens, one pass,
// cheaper than the prefix's own prefill weighed by WorkWeight elsewhere,
// so one worker takes them all.
func TestBurstSharesPrefixWorker(t *testing.T) {
	before := burstWorkers(t, false, 64, 4096)
	after := burstWorkers(t, true, 64, 4096)
	t.Logf("burst of 64 requests sharing a fresh 4096-token prefix over 8 workers: prefilled on %d workers without routed-block credit, %d with", before, after)
	if after != 1 {
		t.Errorf("with routed-block credit the burst went to %d workers, want 1", after)
	}
	if before <= after {
		t.Errorf("without the credit the burst went to %d workers, with it %d: the credit changed nothing", before, after)
	}
}
