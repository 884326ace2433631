package router

import (
	"context"
	"runtime"
	"testing"

	"github.com/kvmesh/kvmesh/internal/cputime"
	"github.com/kvmesh/kvmesh/kv"
)

// BenchmarkRoute times one routing decision (hash + match + cost + load
// booking) for an 8k-token prompt over 64 workers with a warm index; the
// Done that frees the load is outside the timed region's intent but
// inside the loop, so load stays steady.
func BenchmarkRoute(b *testing.B) {
	f, err := NewBenchFleet(BenchFleetConfig{}, Config{Hints: true})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		d, err := f.Router.Route(ctx, Request{Model: "bench", Tokens: f.Prompts[i%len(f.Prompts)]})
		if err != nil {
			b.Fatal(err)
		}
		d.Done()
		i++
	}
}

// BenchmarkRoute7000 is BenchmarkRoute at the width of Dynamo's indexer
// benchmark: 7,000 workers, each holding a prefix of one of the prompts,
// which share their first eighth, so the index answers with most of the
// pool on every request and the router merges that answer with its whole
// pool (mergeDepth) before it filters and prices. Its profile splits a
// decision between the index's answer and the router's use of it.
func BenchmarkRoute7000(b *testing.B) {
	f, err := NewBenchFleet(BenchFleetConfig{Workers: 7000, PromptTokens: 2048, HeldPerWorker: 1}, Config{})
	if err != nil {
		b.Fatal(err)
	}
	local := kv.NewHasher(16, "", "").Local(f.Prompts[0])
	if n := len(f.Index.FindMatches(local, nil)); n < 5000 {
		b.Fatalf("%d of 7000 workers match a prompt", n)
	}
	ctx := context.Background()
	b.ReportAllocs()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c0 := cputime.Thread()
	i := 0
	for b.Loop() {
		d, err := f.Router.Route(ctx, Request{Model: "bench", Tokens: f.Prompts[i%len(f.Prompts)]})
		if err != nil {
			b.Fatal(err)
		}
		d.Done()
		i++
	}
	b.ReportMetric(float64(cputime.Thread()-c0)/float64(b.N), "cpu-ns/op")
}

// BenchmarkEngineHashes times what a hinted decision adds: reading the
// source's engine hashes of its matched prefix (an 8k-token prompt) from
// the bench fleet's index, under the index's writer lock.
func BenchmarkEngineHashes(b *testing.B) {
	f, err := NewBenchFleet(BenchFleetConfig{}, Config{Hints: true})
	if err != nil {
		b.Fatal(err)
	}
	local := kv.NewHasher(16, "", "").Local(f.Prompts[0])
	ms := f.Index.FindMatches(local, nil)
	if len(ms) == 0 {
		b.Fatal("no worker holds the prompt")
	}
	best := ms[0]
	for _, m := range ms {
		if m.Depth[kv.NumTiers-1] > best.Depth[kv.NumTiers-1] {
			best = m
		}
	}
	n := int(best.Depth[kv.NumTiers-1])
	dst := make([]kv.EngineHash, 0, n)
	for b.Loop() {
		dst = f.Index.EngineHashes(best.Worker, local[:n], dst[:0])
	}
	if len(dst) != n {
		b.Fatalf("%d engine hashes for a prefix of %d blocks", len(dst), n)
	}
	b.ReportMetric(float64(n), "blocks")
}
