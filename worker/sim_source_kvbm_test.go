package worker

import (
	"context"
	"testing"

	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/engine/sim/simpeer"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/transfer"
)

// TestSimSourceServesHostTier: blocks the device evicted but the host tier
// (KVBM) holds are served to a peer from G2, every byte verified.
func TestSimSourceServesHostTier(t *testing.T) {
	cfg := peerSimConfig(16)
	cfg.StoreChecksums = true
	cfg.KVBM = &sim.KVBMConfig{HostBlocks: 256}
	e, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	seqs := cachePrompt(t, ctx, e, tokens(10*peerBS+3, 1))
	cachePrompt(t, ctx, e, tokens(10*peerBS+3, 5000))
	cachePrompt(t, ctx, e, tokens(10*peerBS+3, 9000))
	if n := e.Lookup(seqs); n != 0 {
		t.Fatalf("the device still holds %d blocks", n)
	}
	src := simpeer.NewSimSource(e)
	ep := serveSource(t, src, e.SimConfig().Digest)
	c := transfer.NewClient(transfer.ClientOptions{})
	defer c.Close()
	res, err := c.Fetch(ctx, ep, transfer.FetchRequest{Hashes: kv.RawHashes(seqs), Digest: e.SimConfig().Digest,
		Verify: transfer.PayloadVerifier(cfg.Layers, cfg.PayloadSize)})
	if err != nil || len(res.Blocks) != len(seqs) {
		t.Fatalf("fetch from the host tier: %v, outcome %s, %d of %d blocks", err, res.Outcome, len(res.Blocks), len(seqs))
	}
}
