package worker

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/enginetest"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/engine/sim/simpeer"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/transfer"
)

// serveSource serves src on a loopback endpoint until the test ends.
func serveSource(tb testing.TB, src transfer.BlockSource, digest string) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	srv := &transfer.Server{Source: src, Digest: digest}
	go func() { done <- srv.Serve(ctx, ln) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("Serve: %v", err)
		}
	})
	ep, err := transfer.AdvertiseEndpoint("127.0.0.1", ln.Addr().(*net.TCPAddr).Port)
	if err != nil {
		tb.Fatal(err)
	}
	return ep
}

// cachePrompt runs prompt through e (one output token) so its full blocks
// end up cached, and returns their sequence hashes.
func cachePrompt(tb testing.TB, ctx context.Context, e *sim.Engine, prompt []kv.Token) []kv.SeqHash {
	tb.Helper()
	if err := runPrompt(ctx, e, prompt); err != nil {
		tb.Fatal(err)
	}
	_, seq := kv.NewHasher(e.SimConfig().BlockSize, "", "").Blocks(prompt)
	return seq
}

func runPrompt(ctx context.Context, e *sim.Engine, prompt []kv.Token) error {
	return enginetest.Run(ctx, e, &engine.Request{ID: "cache", Tokens: prompt, Sampling: kv.Sampling{MaxTokens: 1, Seed: 1}})
}

func tokens(n int, base kv.Token) []kv.Token {
	p := make([]kv.Token, n)
	for i := range p {
		p[i] = base + kv.Token(i)
	}
	return p
}

// TestSimSourceZeroCopyServe fetches a cached prefix from a SimSource
// (served with writev from the sim's slab, stored checksums) and checks
// every byte against its derivation.
func TestSimSourceZeroCopyServe(t *testing.T) {
	cfg := peerSimConfig(64)
	cfg.StoreChecksums = true
	e, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	seqs := cachePrompt(t, ctx, e, tokens(10*peerBS+3, 1))
	src := simpeer.NewSimSource(e)
	// A view needs a pin (checked before the server holds any).
	if _, err := src.ViewBlock(uint64(seqs[0])); err == nil {
		t.Fatal("view of an unpinned block")
	}
	ep := serveSource(t, src, e.SimConfig().Digest)
	c := transfer.NewClient(transfer.ClientOptions{})
	defer c.Close()

	res, err := c.Fetch(ctx, ep, transfer.FetchRequest{Hashes: kv.RawHashes(append(seqs, 777)), Digest: e.SimConfig().Digest,
		Verify: transfer.PayloadVerifier(cfg.Layers, cfg.PayloadSize)})
	if err != nil || res.Outcome != transfer.OutcomePartial || len(res.Blocks) != len(seqs) {
		t.Fatalf("fetch: %v, outcome %s, %d blocks", err, res.Outcome, len(res.Blocks))
	}
	for i, b := range res.Blocks {
		if sum, ok := src.BlockChecksum(uint64(seqs[i])); !ok || b.Checksum != sum {
			t.Fatalf("block %d: checksum %016x, stored %016x %v", i, b.Checksum, sum, ok)
		}
	}
	// The copying path serves the same bytes.
	buf, err := src.ReadBlock(uint64(seqs[3]), []byte("x"))
	if err != nil || string(buf[1:]) != string(res.Blocks[3].Payload) {
		t.Fatalf("ReadBlock: %v", err)
	}
}

// TestSimSourceStoredChecksumCatchesRot: the server sends the checksum the
// sim took when it stored the block, so bytes that changed since then fail
// the target's check (no Verify callback involved) and cut the prefix.
func TestSimSourceStoredChecksumCatchesRot(t *testing.T) {
	cfg := peerSimConfig(64)
	cfg.StoreChecksums = true
	e, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	seqs := cachePrompt(t, ctx, e, tokens(8*peerBS, 50))
	ep := serveSource(t, simpeer.NewSimSource(e), "")
	c := transfer.NewClient(transfer.ClientOptions{})
	defer c.Close()

	n, release := e.Pin(seqs)
	defer release()
	if n != len(seqs) {
		t.Fatalf("pinned %d of %d", n, len(seqs))
	}
	v, err := e.ViewBlock(kv.SeqHash(seqs[5]))
	if err != nil {
		t.Fatal(err)
	}
	v[17] ^= 0x08 // the source's memory goes bad
	e.Lookup(nil) // publish the write to the server (it locks the engine to pin)
	res, err := c.Fetch(ctx, ep, transfer.FetchRequest{Hashes: kv.RawHashes(seqs)})
	if res.Outcome != transfer.OutcomeCorrupt || len(res.Blocks) != 5 || err == nil {
		t.Fatalf("fetch of a rotten block: %v, outcome %s, %d blocks", err, res.Outcome, len(res.Blocks))
	}
}

// TestSimSourceServesWhileEngineRuns serves fetches from a small pool while
// other requests keep evicting and refilling it (run with -race): every
// block delivered is byte-for-byte its derivation, pins hold what is being
// sent, and evictions really happen meanwhile.
func TestSimSourceServesWhileEngineRuns(t *testing.T) {
	cfg := peerSimConfig(48)
	cfg.PayloadSize, cfg.StoreChecksums = 4<<10, true
	e, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	src := simpeer.NewSimSource(e)
	ep := serveSource(t, src, e.SimConfig().Digest)
	c := transfer.NewClient(transfer.ClientOptions{Timeout: 5 * time.Second})
	defer c.Close()
	verify := transfer.PayloadVerifier(cfg.Layers, cfg.PayloadSize)

	churnCtx, stopChurn := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopChurn()
	for g := range 2 {
		wg.Go(func() {
			for i := 0; churnCtx.Err() == nil; i++ {
				p := tokens(12*peerBS+1, kv.Token(1_000_000*(g+1)+10_000*i))
				if err := runPrompt(churnCtx, e, p); err != nil && churnCtx.Err() == nil {
					t.Error(err)
					return
				}
			}
		})
	}
	prompt := tokens(8*peerBS, 7)
	delivered, fetches := 0, 0
	for round := 0; round < 400 && (delivered < 400 || e.Counters().EvictedBlocks < 200); round++ {
		seqs := cachePrompt(t, ctx, e, prompt)
		res, err := c.Fetch(ctx, ep, transfer.FetchRequest{Hashes: kv.RawHashes(seqs), Digest: cfg.Digest, Verify: verify})
		switch res.Outcome {
		case transfer.OutcomeSuccess, transfer.OutcomePartial, transfer.OutcomeNotFound:
		default:
			t.Fatalf("round %d: fetch %s: %v", round, res.Outcome, err)
		}
		for i, b := range res.Blocks {
			if b.Hash != uint64(seqs[i]) {
				t.Fatalf("round %d: block %d is %016x, want %016x", round, i, b.Hash, seqs[i])
			}
		}
		delivered += len(res.Blocks)
		fetches++
	}
	stopChurn()
	wg.Wait()
	ev := e.Counters().EvictedBlocks
	if delivered < 400 || ev < 200 {
		t.Fatalf("%d fetches delivered %d blocks with %d evictions meanwhile; want ≥ 400 and ≥ 200", fetches, delivered, ev)
	}
	t.Logf("%d fetches, %d blocks delivered and verified, %d evictions meanwhile", fetches, delivered, ev)
}

// TestServingPeerStoresChecksums: a Peer that serves makes its engine keep
// stored checksums, so served blocks carry them; one that only fetches
// does not pay for them.
func TestServingPeerStoresChecksums(t *testing.T) {
	_, eng, _ := servingPeer(t, 64, nil)
	if !eng.SimConfig().StoreChecksums {
		t.Fatal("serving peer's engine keeps no checksums")
	}
	seqs := cachePrompt(t, context.Background(), eng, tokens(3*peerBS, 9))
	if sum, ok := eng.BlockChecksum(kv.SeqHash(seqs[1])); !ok || sum == 0 {
		t.Fatalf("stored checksum %016x %v", sum, ok)
	}
	e2, p2, err := newSimPeer(peerSimConfig(64), PeerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Close()
	defer p2.Close()
	if e2.SimConfig().StoreChecksums {
		t.Fatal("fetch-only peer keeps checksums")
	}
}
