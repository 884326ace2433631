package router

import (
	"context"
	"testing"
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
