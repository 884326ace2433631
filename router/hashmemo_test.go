package router

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

// fresh is what hashing from scratch gives.
func fresh(tokens []kv.Token, bs int, seed uint64) ([]kv.LocalHash, []kv.SeqHash) {
	l := kv.LocalHashes(nil, tokens, bs, seed)
	return l, kv.SeqHashes(nil, l)
}

func checkHashes(t *testing.T, m *hashMemo, tokens []kv.Token, bs int, seed uint64) int {
	t.Helper()
	n := kv.NumFullBlocks(len(tokens), bs)
	l, s, reused := m.hashes(tokens, bs, seed, n)
	wl, ws := fresh(tokens, bs, seed)
	if !slices.Equal(l, wl) || !slices.Equal(s, ws) {
		t.Fatalf("%d tokens, bs %d, seed %x: memo hashes differ from a fresh computation (reused %d of %d blocks)", len(tokens), bs, seed, reused, n)
	}
	return reused
}

// TestHashMemoTurns: a conversation's turns (each the turn before's
// tokens, partial last block included, then new ones) reuse the turn
// before's full blocks, and every answer equals hashing afresh, under
// other block sizes and seeds too (which never share).
func TestHashMemoTurns(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 9))
	m := newHashMemo(hashMemoBytes)
	for _, bs := range []int{16, 64} {
		for _, seed := range []uint64{kv.Seed("", ""), kv.Seed("lora-a", ""), kv.Seed("", "salt-1")} {
			var conv []kv.Token
			before := 0 // the turn before's full blocks
			for turn := range 12 {
				for range 100 + rng.IntN(900) {
					conv = append(conv, kv.Token(rng.Uint32N(50_000)))
				}
				reused := checkHashes(t, m, conv, bs, seed)
				if turn > 0 && before >= hashMemoMinBlocks && reused != before {
					t.Errorf("bs %d seed %x turn %d: reused %d blocks of the turn before's %d", bs, seed, turn, reused, before)
				}
				before = kv.NumFullBlocks(len(conv), bs)
			}
		}
	}
	// A continuation into the next power of two finds the kept prompt;
	// another block size or seed over the same tokens shares nothing.
	tokens := make([]kv.Token, 4096)
	for i := range tokens {
		tokens[i] = kv.Token(i * 7)
	}
	checkHashes(t, m, tokens[:4000], 64, kv.Seed("", ""))
	if r := checkHashes(t, m, tokens, 64, kv.Seed("", "")); r != 62 {
		t.Errorf("a continuation of a kept prompt reused %d blocks, want its 62", r)
	}
	if r := checkHashes(t, m, tokens, 32, kv.Seed("", "")); r != 0 {
		t.Errorf("block size 32 reused %d blocks of a bs 64 entry", r)
	}
	if r := checkHashes(t, m, tokens, 64, kv.Seed("x", "")); r != 0 {
		t.Errorf("another LoRA reused %d blocks", r)
	}
	if r := checkHashes(t, m, tokens, 64, kv.Seed("", "s")); r != 0 {
		t.Errorf("another salt reused %d blocks", r)
	}
}

// TestHashMemoDivergence: a prompt that agrees with a kept one up to some
// token (mid-block, on a block edge, at the first block's probe and past
// it) reuses exactly the blocks before the one that differs.
func TestHashMemoDivergence(t *testing.T) {
	const bs = 16
	seed := kv.Seed("", "")
	base := make([]kv.Token, 100*bs+5)
	for i := range base {
		base[i] = kv.Token(i + 1)
	}
	for _, at := range []int{1, bs - 1, bs, 3*bs + 2, 5*bs - 1, 63*bs + 1, 64 * bs, 99*bs + 3, 100*bs + 2} {
		m := newHashMemo(hashMemoBytes)
		checkHashes(t, m, base, bs, seed)
		p := slices.Clone(base)
		p = append(p, 7, 8, 9)
		p[at]++ // differs from here on
		got := checkHashes(t, m, p, bs, seed)
		want := min(at/bs, 100)
		if at < bs || (at >= 63*bs && at < 64*bs) {
			// The lookup's keys hold the first block and block 63 (64 is
			// the largest power of two ≤ 100): a difference there is a miss.
			want = 0
		}
		if got != want {
			t.Errorf("differing at token %d: reused %d blocks, want %d", at, got, want)
		}
	}
}

// TestHashMemoBudget: the memo holds no more than its budget, and a prompt
// longer than it is hashed and not kept.
func TestHashMemoBudget(t *testing.T) {
	m := newHashMemo(64 << 10)
	seed := kv.Seed("", "")
	for i := range 50 {
		checkHashes(t, m, prompt(i, 2000), 16, seed)
		if m.held > m.budget {
			t.Fatalf("holds %d bytes, budget %d", m.held, m.budget)
		}
	}
	checkHashes(t, m, prompt(99, 40_000), 16, seed)
	if r := checkHashes(t, m, prompt(99, 40_100), 16, seed); r != 0 {
		t.Errorf("a prompt over the budget was kept (%d blocks reused)", r)
	}
	if r := checkHashes(t, m, prompt(49, 2100), 16, seed); r != 125 {
		t.Errorf("the most recent prompt's continuation reused %d blocks, want 125", r)
	}
}

// TestHashMemoConcurrent: conversations played at once, some sharing
// their start, all answered as hashing afresh would (run with -race).
func TestHashMemoConcurrent(t *testing.T) {
	m := newHashMemo(1 << 20)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 3))
			conv := prompt(g%2, 300) // two shared starts
			for range 30 {
				for range rng.IntN(200) {
					conv = append(conv, kv.Token(rng.Uint32N(1000)))
				}
				n := kv.NumFullBlocks(len(conv), 16)
				l, s, _ := m.hashes(conv, 16, kv.Seed("", ""), n)
				wl, ws := fresh(conv, 16, kv.Seed("", ""))
				if !slices.Equal(l, wl) || !slices.Equal(s, ws) {
					t.Error("concurrent memo hashes differ from a fresh computation")
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestRouteHashesNextTurn: through Route, a next turn's decision carries
// the hashes a fresh computation gives, and its blocks came from the memo.
func TestRouteHashesNextTurn(t *testing.T) {
	r := newRouter(t, Config{}, 1)
	turn1 := prompt(5, 20*testBS+3)
	turn2 := append(slices.Clone(turn1), prompt(6, 9*testBS)...)
	for _, p := range [][]kv.Token{turn1, turn2} {
		d, err := r.Route(context.Background(), Request{Model: "m", Tokens: p, Salt: "s"})
		if err != nil {
			t.Fatal(err)
		}
		wl, ws := fresh(p, testBS, kv.Seed("", "s"))
		if !slices.Equal(d.Local, wl) || !slices.Equal(d.Seq, ws) {
			t.Fatalf("%d tokens: the decision's hashes differ from a fresh computation", len(p))
		}
		d.Done()
	}
	if _, _, reused := r.hashes.hashes(turn2, testBS, kv.Seed("", "s"), kv.NumFullBlocks(len(turn2), testBS)); reused != kv.NumFullBlocks(len(turn2), testBS) {
		t.Errorf("the router's memo reused %d blocks of a prompt it routed", reused)
	}
}

// BenchmarkHashMemo is a next turn's block hashes (16.4k tokens, the turn
// before's 15k kept, block size 64): fresh hashes every block, memo
// compares the kept blocks' tokens and hashes the new ones.
//
//	go test ./router -run '^$' -bench HashMemo
func BenchmarkHashMemo(b *testing.B) {
	const bs = 64
	seed := kv.Seed("", "s")
	turn := prompt(3, 16_400)
	before := turn[:15_000]
	n := kv.NumFullBlocks(len(turn), bs)
	b.Run("fresh", func(b *testing.B) {
		for b.Loop() {
			newHashMemo(0).hashes(turn, bs, seed, n)
		}
	})
	b.Run("memo", func(b *testing.B) {
		// Batches of 64 conversations (seeds), each with its turn before
		// kept, prepared untimed; a timed iteration is one's next turn.
		var seeds [64]uint64
		for i := range seeds {
			seeds[i] = kv.Seed("", strconv.Itoa(i))
		}
		var m *hashMemo
		i := len(seeds)
		for b.Loop() {
			if i == len(seeds) {
				b.StopTimer()
				m, i = newHashMemo(hashMemoBytes), 0
				for _, s := range seeds {
					m.hashes(before, bs, s, kv.NumFullBlocks(len(before), bs))
				}
				b.StartTimer()
			}
			if _, _, r := m.hashes(turn, bs, seeds[i], n); r == 0 {
				b.Fatal("no reuse")
			}
			i++
		}
	})
}
