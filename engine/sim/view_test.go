package sim

import (
	"bytes"
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/enginetest"
	"github.com/kvmesh/kvmesh/kv"
)

// derived is the payload a block with sequence hash seq must hold.
func derived(cfg Config, seq kv.SeqHash) []byte {
	var b []byte
	for l := 0; l < cfg.Layers; l++ {
		b = append(b, kv.Payload(seq, l, cfg.PayloadSize)...)
	}
	return b
}

func promptOf(n int, base kv.Token) []kv.Token {
	p := make([]kv.Token, n)
	for i := range p {
		p[i] = base + kv.Token(7*i)
	}
	return p
}

func TestViewBlockAndStoredChecksum(t *testing.T) {
	cfg := testConfig()
	cfg.Layers, cfg.PayloadSize = 3, 40
	prompt := promptOf(4*cfg.BlockSize+1, 1)
	seqs := seqOf(cfg, prompt)

	// Without StoreChecksums nothing is kept, views work all the same.
	off := mustCore(t, cfg)
	off.Add(req("a", prompt, 1), time.Time{})
	drain(off)
	if _, ok := off.BlockChecksum(seqs[0]); ok {
		t.Fatal("checksum kept without StoreChecksums")
	}
	_, rel := off.Pin(seqs)
	if v, err := off.ViewBlock(seqs[2]); err != nil || !bytes.Equal(v, derived(cfg, seqs[2])) {
		t.Fatalf("view without StoreChecksums: %v", err)
	}
	rel()

	cfg.StoreChecksums = true
	a := mustCore(t, cfg)
	a.Add(req("a", prompt, 1), time.Time{})
	drain(a)

	// Idle cached blocks have checksums but no view: nothing pins them.
	if _, err := a.ViewBlock(seqs[0]); err == nil || !strings.Contains(err.Error(), "not pinned") {
		t.Fatalf("view of an unpinned block: %v", err)
	}
	if _, err := a.ViewBlock(12345); err == nil || !strings.Contains(err.Error(), "not cached") {
		t.Fatalf("view of an uncached block: %v", err)
	}
	if _, ok := a.BlockChecksum(12345); ok {
		t.Fatal("checksum of an uncached block")
	}

	n, release := a.Pin(seqs)
	if n != len(seqs) {
		t.Fatalf("pinned %d of %d", n, len(seqs))
	}
	for i, h := range seqs {
		v, err := a.ViewBlock(h)
		if err != nil {
			t.Fatal(err)
		}
		want := derived(cfg, h)
		if !bytes.Equal(v, want) || cap(v) != len(v) {
			t.Fatalf("block %d: view of %d bytes (cap %d) is not its derivation", i, len(v), cap(v))
		}
		sum, ok := a.BlockChecksum(h)
		if !ok || sum != kv.Checksum(want) {
			t.Fatalf("block %d: stored checksum %016x %v, want %016x", i, sum, ok, kv.Checksum(want))
		}
	}
	// The checksum is the one taken at store time: bytes that rot later no
	// longer match it.
	v, _ := a.ViewBlock(seqs[1])
	before, _ := a.BlockChecksum(seqs[1])
	v[5] ^= 1
	if after, _ := a.BlockChecksum(seqs[1]); after != before || after == kv.Checksum(v) {
		t.Fatal("BlockChecksum follows the bytes instead of keeping the stored sum")
	}
	v[5] ^= 1
	release()

	// Inserted blocks get their checksum too.
	b := mustCore(t, cfg)
	b.cfg.Fetcher = peerFetcher(a, cfg, -1)
	b.Add(req("b", prompt, 1), time.Time{})
	if ct := b.Counters(); ct.InsertedBlocks != uint64(len(seqs)) {
		t.Fatalf("inserted %d blocks", ct.InsertedBlocks)
	}
	for i, h := range seqs {
		if sum, ok := b.BlockChecksum(h); !ok || sum != kv.Checksum(derived(cfg, h)) {
			t.Fatalf("inserted block %d: checksum %016x %v", i, sum, ok)
		}
	}
	drain(b)
}

// TestPinnedViewSurvivesEviction churns a small pool through several times
// its size while a prefix is pinned: the pinned views keep their bytes and
// checksums; once released the blocks are evicted and their slots reused.
func TestPinnedViewSurvivesEviction(t *testing.T) {
	cfg := testConfig()
	cfg.Blocks, cfg.StoreChecksums = 24, true
	a := mustCore(t, cfg)
	prompt := promptOf(6*cfg.BlockSize+1, 3)
	a.Add(req("a", prompt, 1), time.Time{})
	drain(a)
	seqs := seqOf(cfg, prompt)
	n, release := a.Pin(seqs)
	if n != 6 {
		t.Fatalf("pinned %d", n)
	}
	views := make([][]byte, n)
	for i, h := range seqs {
		v, err := a.ViewBlock(h)
		if err != nil {
			t.Fatal(err)
		}
		views[i] = v
	}
	churn := func(round int) {
		for j := range 4 {
			a.Add(req("churn", promptOf(8*cfg.BlockSize+1, kv.Token(1000*(round*4+j+1))), 2), time.Time{})
		}
		drain(a)
	}
	for r := range 5 {
		churn(r)
	}
	if ev := a.Counters().EvictedBlocks; ev < 3*uint64(cfg.Blocks) {
		t.Fatalf("churn evicted only %d blocks", ev)
	}
	for i, h := range seqs {
		sum, ok := a.BlockChecksum(h)
		if !bytes.Equal(views[i], derived(cfg, h)) || !ok || sum != kv.Checksum(views[i]) {
			t.Fatalf("pinned block %d changed under churn", i)
		}
	}
	pins := map[int32]int{}
	for _, h := range seqs {
		id, _ := a.pool.byHash.Get(h)
		pins[id]++
	}
	checkPool(t, a, pins)
	release()
	for r := 5; r < 10; r++ {
		churn(r)
	}
	if a.Lookup(seqs) != 0 {
		t.Fatal("released blocks were never evicted")
	}
	if _, err := a.ViewBlock(seqs[0]); err == nil {
		t.Fatal("view of an evicted block")
	}
}

// TestEngineViewsWhileRunning reads pinned views without the engine's lock
// while other requests evict and refill the rest of the pool (run with
// -race: the views must never overlap a write).
func TestEngineViewsWhileRunning(t *testing.T) {
	cfg := testConfig()
	cfg.Blocks, cfg.SpeedupRatio, cfg.PayloadSize, cfg.StoreChecksums = 40, 0, 256, true
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	run := func(toks []kv.Token) error {
		return enginetest.Run(ctx, e, &engine.Request{ID: "r", Tokens: toks, Sampling: kv.Sampling{MaxTokens: 2, Seed: 1}})
	}
	prompt := promptOf(6*cfg.BlockSize+1, 5)
	seqs := seqOf(cfg, prompt)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	var stopOnce sync.Once
	halt := func() { stopOnce.Do(func() { close(stop) }) }
	defer halt()
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := run(promptOf(8*cfg.BlockSize+1, kv.Token(100000+1000*i))); err != nil {
				t.Error(err)
				return
			}
		}
	})
	pinnedReads := 0
	// Until enough pinned reads were checked while the background
	// requests evicted blocks around them (on a loaded machine the
	// background goroutine may be slow to start evicting).
	for round := 0; round < 2000 && (pinnedReads < 50 || e.Counters().EvictedBlocks == 0); round++ {
		if err := run(prompt); err != nil {
			t.Fatal(err)
		}
		n, release := e.Pin(seqs)
		for i := 0; i < n; i++ {
			v, err := e.ViewBlock(seqs[i])
			if err != nil {
				t.Fatal(err)
			}
			sum, ok := e.BlockChecksum(seqs[i])
			runtime.Gosched() // let the engine write other blocks meanwhile
			if !ok || sum != kv.Checksum(v) || !bytes.Equal(v, derived(cfg, seqs[i])) {
				t.Fatalf("round %d block %d: pinned view is not the block's payload", round, i)
			}
			pinnedReads++
		}
		release()
	}
	halt()
	wg.Wait()
	if pinnedReads < 50 {
		t.Fatalf("only %d pinned reads", pinnedReads)
	}
	if ev := e.Counters().EvictedBlocks; ev == 0 {
		t.Fatal("no evictions while viewing")
	}
}

// TestLazyFillOnFirstRead: a computed block's bytes are written on their
// first read, whichever read comes first (checksum, layer copy or view),
// and a slot reused by another block never shows the old block's bytes.
func TestLazyFillOnFirstRead(t *testing.T) {
	cfg := testConfig()
	cfg.Blocks, cfg.Layers, cfg.PayloadSize, cfg.StoreChecksums = 8, 2, 24, true
	a := mustCore(t, cfg)
	p1 := promptOf(4*cfg.BlockSize+1, 5)
	a.Add(req("a", p1, 1), time.Time{})
	drain(a)
	s1 := seqOf(cfg, p1)
	for i, h := range s1 {
		id, _ := a.pool.byHash.Get(h)
		if a.pool.blocks[id].flags&flagUnfilled == 0 {
			t.Fatalf("block %d filled before any read", i)
		}
	}
	// Checksum first: it must be the derivation's, and fill the bytes.
	if sum, ok := a.BlockChecksum(s1[0]); !ok || sum != kv.Checksum(derived(cfg, s1[0])) {
		t.Fatalf("checksum before any view: %016x %v", sum, ok)
	}
	// A layer copy first.
	buf := make([]byte, cfg.PayloadSize)
	if _, err := a.ReadPayload(s1[1], 1, buf); err != nil || !bytes.Equal(buf, kv.Payload(s1[1], 1, cfg.PayloadSize)) {
		t.Fatalf("layer read before any view: %v", err)
	}
	// Fill the rest of p1, then push it out with p2 (the whole pool), whose
	// blocks reuse those slots and must read as p2's derivation.
	n1, rel1 := a.Pin(s1)
	for _, h := range s1[:n1] {
		if _, err := a.ViewBlock(h); err != nil {
			t.Fatal(err)
		}
	}
	rel1()
	p2 := promptOf(7*cfg.BlockSize+1, 900)
	a.Add(req("b", p2, 1), time.Time{})
	drain(a)
	if a.Lookup(s1) != 0 {
		t.Fatal("p1 still cached")
	}
	s2 := seqOf(cfg, p2)
	n, release := a.Pin(s2)
	defer release()
	for i, h := range s2[:n] {
		v, err := a.ViewBlock(h)
		if err != nil || !bytes.Equal(v, derived(cfg, h)) {
			t.Fatalf("reused slot, block %d: %v", i, err)
		}
		if sum, ok := a.BlockChecksum(h); !ok || sum != kv.Checksum(v) {
			t.Fatalf("reused slot, block %d: checksum %016x %v", i, sum, ok)
		}
	}
	if n == 0 {
		t.Fatal("nothing of p2 cached")
	}
}
