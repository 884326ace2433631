package sim

import (
	"context"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

// BenchmarkEngineGenerate is the Engine wrapper's per-request path (no
// modelled waiting): Generate, the pump and the stepping loop, with a
// prompt that hits the cache after the first run. dp2 sends every other
// request to rank 1.
func BenchmarkEngineGenerate(b *testing.B) {
	for _, dp := range []int{1, 2} {
		b.Run(map[int]string{1: "dp1", 2: "dp2"}[dp], func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.SpeedupRatio, cfg.Blocks, cfg.DPSize = 0, 1024, dp
			e, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			prompt := make([]kv.Token, 512)
			for i := range prompt {
				prompt[i] = kv.Token(i)
			}
			ctx := context.Background()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				r := req("b", prompt, 16)
				r.DPRank = i % dp
				ch, err := e.Generate(ctx, r)
				if err != nil {
					b.Fatal(err)
				}
				for range ch {
				}
			}
		})
	}
}
