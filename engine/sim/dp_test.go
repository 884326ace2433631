package sim

import (
	"context"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/kv"
)

// With DPSize 2 each rank is its own engine: a prompt run on rank 1 is
// cached on rank 1 only, its events carry DPRank 1, each rank's load is its
// own, and Stats and Counters sum the ranks.
func TestEngineDPRanks(t *testing.T) {
	cfg := testConfig()
	cfg.SpeedupRatio = 0
	cfg.Worker = kv.WorkerKey{Instance: 9}
	cfg.DPSize = 2
	e := mustEngine(t, cfg)
	if e.DPSize() != 2 || e.Rank(0) != e || e.Rank(1) == nil || e.Rank(2) != nil || e.Rank(-1) != nil {
		t.Fatalf("dp size %d, ranks %p %p %p", e.DPSize(), e.Rank(0), e.Rank(1), e.Rank(2))
	}
	var mu sync.Mutex
	var evs []kv.Event
	e.SetEventSink(func(b []kv.Event) { mu.Lock(); evs = append(evs, b...); mu.Unlock() })

	prompt := make([]kv.Token, 4*cfg.BlockSize)
	for i := range prompt {
		prompt[i] = kv.Token(i*7 + 1)
	}
	run := func(rank int) engine.Usage {
		t.Helper()
		r := req("r", prompt, 2)
		r.DPRank = rank
		ch, err := e.Generate(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		_, last := collect(t, ch)
		if last.Usage == nil {
			t.Fatalf("rank %d: no usage (%+v)", rank, last)
		}
		return *last.Usage
	}
	if u := run(1); u.CachedTokens != 0 {
		t.Fatalf("cold run on rank 1 cached %d tokens", u.CachedTokens)
	}
	mu.Lock()
	stored := 0
	for _, ev := range evs {
		if ev.Worker != (kv.WorkerKey{Instance: 9, DPRank: 1}) {
			t.Fatalf("event of a rank 1 request on %+v", ev.Worker)
		}
		if ev.Kind == kv.EventStored {
			stored += len(ev.Blocks)
		}
	}
	mu.Unlock()
	if stored != 4 {
		t.Fatalf("rank 1 stored %d blocks, want 4", stored)
	}
	seqs := seqHashesOf(cfg.BlockSize, prompt)
	if n0, n1 := e.Rank(0).Lookup(seqs), e.Rank(1).Lookup(seqs); n0 != 0 || n1 != 4 {
		t.Fatalf("cached blocks: rank 0 %d, rank 1 %d; want 0 and 4", n0, n1)
	}
	// A pin holds rank 1's blocks in use: only rank 1's load shows them.
	n, release := e.Rank(1).Pin(seqs)
	s0, s1 := e.RankStats(0), e.RankStats(1)
	if n != 4 || s0.UsedBlocks != 0 || s1.UsedBlocks != 4 || s0.TotalBlocks != cfg.Blocks || s1.TotalBlocks != cfg.Blocks {
		t.Fatalf("pinned %d; rank stats %+v %+v", n, s0, s1)
	}
	if s := e.Stats(); s.TotalBlocks != 2*cfg.Blocks || s.UsedBlocks != 4 {
		t.Fatalf("summed stats %+v", s)
	}
	release()
	if u := run(1); u.CachedTokens < 3*cfg.BlockSize {
		t.Fatalf("repeat on rank 1 cached %d tokens, want ≥ %d", u.CachedTokens, 3*cfg.BlockSize)
	}
	if u := run(0); u.CachedTokens != 0 {
		t.Fatalf("rank 0 found %d cached tokens of rank 1's prompt", u.CachedTokens)
	}
	if c := e.Counters(); c.Finished != 3 || c.Added != 3 {
		t.Fatalf("summed counters %+v", c)
	}
	if c := e.Rank(1).Counters(); c.Finished != 2 {
		t.Fatalf("rank 1 counters %+v", c)
	}
	mu.Lock()
	var on0 int
	for _, ev := range evs {
		if ev.Worker.DPRank == 0 {
			on0++
		}
	}
	mu.Unlock()
	if on0 == 0 {
		t.Fatal("rank 0's run produced no rank 0 events")
	}
	r := req("bad", prompt, 1)
	r.DPRank = 2
	if _, err := e.Generate(context.Background(), r); err == nil {
		t.Fatal("dp rank 2 of 2 accepted")
	}
}

// A single-rank engine refuses other ranks; a bad dp size is refused.
func TestEngineDPRankChecks(t *testing.T) {
	cfg := testConfig()
	cfg.SpeedupRatio = 0
	e := mustEngine(t, cfg)
	if e.DPSize() != 1 || e.RankStats(1) != (engine.Stats{}) {
		t.Fatalf("single rank: dp %d, rank 1 stats %+v", e.DPSize(), e.RankStats(1))
	}
	r := req("r", []kv.Token{1, 2, 3}, 1)
	r.DPRank = 1
	if _, err := e.Generate(context.Background(), r); err == nil {
		t.Fatal("dp rank 1 accepted by a single-rank engine")
	}
	for _, n := range []int{-1, 1025} {
		cfg.DPSize = n
		if e, err := New(cfg); err == nil {
			e.Close()
			t.Fatalf("dp size %d accepted", n)
		}
	}
}

func seqHashesOf(bs int, toks []kv.Token) []kv.SeqHash {
	_, seq := kv.NewHasher(bs, "", "").Blocks(toks)
	return seq
}
