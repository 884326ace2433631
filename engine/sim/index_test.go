package sim

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/kv"
)

// TestEventsReplayIntoIndex feeds two cores' KV events into the router's
// index and checks, as the load runs, that the index holds exactly as many
// device blocks per worker as the pool caches, absorbed no bad event, and
// answers every prompt's overlap exactly as the pool's own lookup does.
func TestEventsReplayIntoIndex(t *testing.T) {
	ix := index.New()
	r := rand.New(rand.NewPCG(5, 6))
	cores := make([]*Core, 2)
	for i := range cores {
		cfg := testConfig()
		cfg.Blocks = 40
		cfg.Worker = kv.WorkerKey{Instance: uint64(10 + i), DPRank: uint32(i)}
		cores[i] = mustCore(t, cfg)
		cores[i].SetEventSink(func(b []kv.Event) {
			for _, e := range b {
				ix.Apply(e)
			}
		})
	}
	prefixes := make([][]kv.Token, 5)
	for i := range prefixes {
		prefixes[i] = make([]kv.Token, 4*(1+r.IntN(6)))
		for j := range prefixes[i] {
			prefixes[i][j] = kv.Token(r.IntN(1000))
		}
	}
	loras := []string{"", "a"}
	var reqs []*engine.Request
	now := time.Time{}
	for step := 0; step < 1500; step++ {
		if r.IntN(3) == 0 {
			toks := append([]kv.Token(nil), prefixes[r.IntN(len(prefixes))]...)
			for j := r.IntN(14); j >= 0; j-- {
				toks = append(toks, kv.Token(r.IntN(1000)))
			}
			rq := &engine.Request{ID: fmt.Sprint(len(reqs)), Tokens: toks, Sampling: kv.Sampling{MaxTokens: 1 + r.IntN(12)}, LoRA: loras[r.IntN(2)]}
			if _, err := cores[r.IntN(2)].Add(rq, now); err != nil {
				t.Fatal(err)
			}
			reqs = append(reqs, rq)
		}
		for _, c := range cores {
			now = c.Step(now).End
		}
		if step%25 != 0 {
			continue
		}
		st := ix.Stats()
		if st.ParentNotFound+st.DuplicateStore+st.RemoveUnknown+st.Rebound+st.BadTier+st.BadKind != 0 {
			t.Fatalf("step %d: the index absorbed bad events: %+v", step, st)
		}
		for _, c := range cores {
			w := c.Config().Worker
			if got := ix.BlockCounts(w)[kv.TierDevice]; got != c.CachedBlocks() {
				t.Fatalf("step %d: index holds %d device blocks of %v, pool %d", step, got, w, c.CachedBlocks())
			}
		}
		for _, rq := range reqs[max(0, len(reqs)-20):] {
			local, seqs := kv.NewHasher(4, rq.LoRA, "").Blocks(rq.Tokens)
			depth := map[kv.WorkerKey]int{}
			for _, m := range ix.FindMatches(local, nil) {
				depth[m.Worker] = int(m.Depth[kv.TierDevice])
			}
			for _, c := range cores {
				if want := c.Lookup(seqs); depth[c.Config().Worker] != want {
					t.Fatalf("step %d: index overlap %d for %v, pool lookup %d", step, depth[c.Config().Worker], c.Config().Worker, want)
				}
			}
		}
	}
	if ix.Stats().Events == 0 || cores[0].Counters().EvictedBlocks == 0 {
		t.Fatal("the load produced no events or no evictions")
	}
}
