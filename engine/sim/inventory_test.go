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

// TestInventoryIsTheHoldings runs a load with evictions and peer fetches
// (whose chains are freed first to last, so a parent can go before its
// child) and checks, as it runs, that each core's inventory lists exactly
// the blocks its pool holds, each once, parents first, and that it rebuilds
// in an empty index what the core's live events built: the same answer to
// every prompt, and every block reachable from the root.
func TestInventoryIsTheHoldings(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	live := index.New()
	cores := make([]*Core, 2)
	for i := range cores {
		cfg := testConfig()
		cfg.Blocks = 40
		cfg.Worker = kv.WorkerKey{Instance: uint64(10 + i), DPRank: uint32(i)}
		cores[i] = mustCore(t, cfg)
		cores[i].SetEventSink(func(b []kv.Event) {
			for _, e := range b {
				live.Apply(e)
			}
		})
	}
	cores[1].cfg.Fetcher = peerFetcher(cores[0], cores[0].cfg, -1)
	prefixes := make([][]kv.Token, 5)
	for i := range prefixes {
		prefixes[i] = make([]kv.Token, 4*(1+r.IntN(6)))
		for j := range prefixes[i] {
			prefixes[i][j] = kv.Token(r.IntN(1000))
		}
	}
	var reqs []*engine.Request
	now := time.Time{}
	for step := 0; step < 1500; step++ {
		if r.IntN(3) == 0 {
			toks := append([]kv.Token(nil), prefixes[r.IntN(len(prefixes))]...)
			for j := r.IntN(14); j >= 0; j-- {
				toks = append(toks, kv.Token(r.IntN(1000)))
			}
			rq := &engine.Request{ID: fmt.Sprint(len(reqs)), Tokens: toks, Sampling: kv.Sampling{MaxTokens: 1 + r.IntN(12)}}
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
		for _, c := range cores {
			checkInventory(t, c, live, reqs[max(0, len(reqs)-30):])
		}
	}
	if cores[0].Counters().EvictedBlocks == 0 || cores[1].Counters().InsertedBlocks == 0 {
		t.Fatalf("the load evicted or fetched nothing: %+v %+v", cores[0].Counters(), cores[1].Counters())
	}
}

func checkInventory(t *testing.T, c *Core, live *index.Index, reqs []*engine.Request) {
	t.Helper()
	w := c.Config().Worker
	cached := map[kv.SeqHash]CachedBlock{}
	for _, b := range c.AppendCached(nil) {
		cached[b.Seq] = b
	}
	listed := map[kv.SeqHash]bool{}
	for _, e := range c.Inventory() {
		if e.ID != 0 || e.Worker != w || e.Tier != kv.TierDevice || e.Kind != kv.EventStored || len(e.Blocks) == 0 {
			t.Fatalf("inventory event %+v", e)
		}
		parent, hasParent := SeqOf(e.Parent), e.HasParent
		for _, blk := range e.Blocks {
			seq := SeqOf(blk.EngineHash)
			b, ok := cached[seq]
			switch {
			case !ok:
				t.Fatalf("%v: inventory lists %016x, which the pool does not hold", w, seq)
			case listed[seq]:
				t.Fatalf("%v: inventory lists %016x twice", w, seq)
			case b.Local != blk.LocalHash || b.HasParent != hasParent || b.HasParent && b.Parent != parent:
				t.Fatalf("%v: inventory block %016x local %016x under %016x, pool %+v", w, seq, blk.LocalHash, parent, b)
			}
			if _, held := cached[parent]; hasParent && held && !listed[parent] {
				t.Fatalf("%v: block %016x listed before its parent %016x", w, seq, parent)
			}
			listed[seq] = true
			parent, hasParent = seq, true
		}
	}
	if len(listed) != len(cached) {
		t.Fatalf("%v: inventory lists %d blocks, the pool holds %d", w, len(listed), len(cached))
	}
	rebuilt := index.New()
	for _, e := range c.Inventory() {
		rebuilt.Apply(e)
	}
	reachable := 0
	for _, b := range cached {
		for b.HasParent {
			p, ok := cached[b.Parent]
			if !ok {
				break
			}
			b = p
		}
		if !b.HasParent {
			reachable++
		}
	}
	if got := rebuilt.BlockCounts(w)[kv.TierDevice]; got != reachable {
		t.Fatalf("%v: rebuilt index holds %d blocks, %d are reachable", w, got, reachable)
	}
	for _, rq := range reqs {
		local, seqs := kv.NewHasher(c.Config().BlockSize, rq.LoRA, "").Blocks(rq.Tokens)
		depth := func(ix *index.Index) uint32 {
			for _, m := range ix.FindMatches(local, nil) {
				if m.Worker == w {
					return m.Depth[kv.TierDevice]
				}
			}
			return 0
		}
		if got, want, pool := depth(rebuilt), depth(live), c.Lookup(seqs); got != want || int(got) != pool {
			t.Fatalf("%v request %s: rebuilt index overlap %d, live %d, pool %d", w, rq.ID, got, want, pool)
		}
	}
}

// A fetched chain is freed first to last, so its first block is evicted
// before the rest: the inventory lists the orphans under the parent they
// lost, and an index rebuilt from it holds none of them, as no query can
// reach them.
func TestInventoryOrphans(t *testing.T) {
	cfg := testConfig() // 4-token blocks
	a := mustCore(t, cfg)
	prompt := make([]kv.Token, 12) // 3 full blocks
	for i := range prompt {
		prompt[i] = kv.Token(5*i + 3)
	}
	a.Add(req("a", prompt, 1), time.Time{})
	drain(a)
	bcfg := cfg
	bcfg.Blocks = 4
	bcfg.Worker = kv.WorkerKey{Instance: 99}
	bcfg.Fetcher = peerFetcher(a, cfg, -1)
	b := mustCore(t, bcfg)
	s, err := b.Add(req("b", prompt, 1), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	b.Abort(s, time.Time{}) // the fetched chain stays, idle, freed first to last
	other := make([]kv.Token, 8)
	for i := range other {
		other[i] = kv.Token(9000 + i)
	}
	b.Add(req("other", other, 1), time.Time{})
	drain(b)
	seqs := seqOf(cfg, prompt)
	if b.Lookup(seqs[:1]) != 0 || b.Lookup(seqs[1:]) != 2 {
		t.Fatalf("want the chain's first block evicted and the other two held: %+v", b.AppendCached(nil))
	}
	var orphans []kv.Event
	for _, e := range b.Inventory() {
		if e.HasParent && e.Parent == EngineHash(seqs[0]) {
			orphans = append(orphans, e)
		}
	}
	if len(orphans) != 1 || len(orphans[0].Blocks) != 2 || orphans[0].Blocks[0].EngineHash != EngineHash(seqs[1]) {
		t.Fatalf("orphan events %+v", orphans)
	}
	rebuilt := index.New()
	for _, e := range b.Inventory() {
		rebuilt.Apply(e)
	}
	if got, want := rebuilt.BlockCounts(bcfg.Worker)[kv.TierDevice], b.CachedBlocks()-2; got != want {
		t.Fatalf("rebuilt index holds %d blocks, want %d (all but the orphans)", got, want)
	}
}
