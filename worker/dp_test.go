package worker

import (
	"context"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/api/apitest"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/transfer"
)

var generateUsage = apitest.GenerateUsage

// A worker with DP size 2 is two engines behind one instance: dp_rank 1
// runs on rank 1's cache (a repeat hits there, not on rank 0), its KV events
// are rank 1's, load is published per rank, and rank r's control endpoint
// serves rank r's blocks.
func TestWorkerDPRanks(t *testing.T) {
	_, nc := startNATS(t)
	loads := subscribeLoads(t, nc, 64)

	cfg := peerSimConfig(128)
	cfg.DPSize = 2
	eng, p, err := newSimPeer(cfg, PeerConfig{Listen: "127.0.0.1:0", AdvertiseHost: "127.0.0.1", Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{DPSize: 3}, eng, nil); err == nil {
		t.Fatal("worker dp size 3 accepted for a 2-rank engine")
	}
	w, c := startWorkerWith(t, nc, eng, Config{Peer: p})
	inst := w.Instance()
	if inst.DPSize != 2 || len(inst.ControlEndpoints) != 2 {
		t.Fatalf("instance %+v", inst)
	}

	toks := prompt(11, 6*peerBS+5)
	req := func(rank uint32) *api.GenerateRequest {
		return &api.GenerateRequest{RequestId: "dp", Tokens: toks, MaxTokens: 3, Seed: 1, DpRank: rank}
	}
	if u := generateUsage(t, c, req(1)); u.GetCachedTokens() != 0 {
		t.Fatalf("cold rank 1 cached %d", u.GetCachedTokens())
	}
	if u := generateUsage(t, c, req(1)); u.GetCachedTokens() < 6*peerBS-peerBS {
		t.Fatalf("repeat on rank 1 cached %d tokens", u.GetCachedTokens())
	}
	log := w.EventLog()
	if log.LastID(0) != 0 || log.LastID(1) == 0 {
		t.Fatalf("last event ids: rank 0 %d, rank 1 %d", log.LastID(0), log.LastID(1))
	}
	dump, _, ok := log.Dump(kv.WorkerKey{Instance: w.InstanceID(), DPRank: 1})
	if !ok || len(dump) == 0 {
		t.Fatal("rank 1's inventory lists nothing")
	}
	if dump0, _, _ := log.Dump(kv.WorkerKey{Instance: w.InstanceID()}); len(dump0) != 0 {
		t.Fatalf("rank 0 lists %d events, yet ran nothing", len(dump0))
	}

	// Rank 1's endpoint serves the prompt's blocks; rank 0's has none.
	seqs := seqHashes(toks)
	tc := transfer.NewClient(transfer.ClientOptions{Timeout: 2 * time.Second})
	defer tc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := tc.Fetch(ctx, inst.ControlEndpoints[1], transfer.FetchRequest{Hashes: kv.RawHashes(seqs), Digest: p.Digest()})
	if err != nil || len(res.Blocks) != len(seqs) {
		t.Fatalf("rank 1 served %d of %d blocks: %v (%s)", len(res.Blocks), len(seqs), err, res.Outcome)
	}
	if res, _ := tc.Fetch(ctx, inst.ControlEndpoints[0], transfer.FetchRequest{Hashes: kv.RawHashes(seqs), Digest: p.Digest()}); len(res.Blocks) != 0 || res.Outcome != transfer.OutcomeNotFound {
		t.Fatalf("rank 0 served %d blocks (%s)", len(res.Blocks), res.Outcome)
	}

	// Each rank's load is its own: blocks pinned on rank 1 show on rank 1.
	n, release := eng.Rank(1).Pin(seqs)
	rs := w.loadSample()
	release()
	if len(rs) != 2 || rs[0].DPRank != 0 || rs[1].DPRank != 1 {
		t.Fatalf("load sample %+v", rs)
	}
	if rs[1].UsedBlocks != n || rs[0].UsedBlocks != 0 || rs[0].TotalBlocks != 128 || rs[1].TotalBlocks != 128 {
		t.Fatalf("pinned %d on rank 1; load %+v", n, rs)
	}
	if rs[1].LastEventID != log.LastID(1) || rs[0].LastEventID != 0 || rs[0].LastEventIDs != nil || rs[1].LastEventIDs != nil {
		t.Fatalf("last event ids %+v", rs)
	}
	// Published per rank on NATS.
	seen := map[uint32]bool{}
	for deadline := time.After(5 * time.Second); !seen[0] || !seen[1]; {
		select {
		case r := <-loads:
			if r.Instance != w.InstanceID() || r.TotalBlocks != 128 {
				t.Fatalf("load report %+v", r)
			}
			if r.DPRank == 1 && r.LastEventID != log.LastID(1) {
				continue // taken before the last run ended
			}
			seen[r.DPRank] = true
		case <-deadline:
			t.Fatalf("load reports of ranks %v only", seen)
		}
	}

	// A request on rank 0 finds none of rank 1's cache, except what a hint
	// fetches from rank 1's endpoint (another rank is another cache).
	if u := generateUsage(t, c, req(0)); u.GetCachedTokens() != 0 {
		t.Fatalf("rank 0 cached %d tokens of rank 1's prompt", u.GetCachedTokens())
	}
	toks2 := prompt(5000, 4*peerBS+1)
	generateUsage(t, c, &api.GenerateRequest{Tokens: toks2, MaxTokens: 1, DpRank: 1})
	hint := api.HintToProto(simHint("sel", inst.ControlEndpoints[1], seqHashes(toks2)))
	u := generateUsage(t, c, &api.GenerateRequest{Tokens: toks2, MaxTokens: 1, DpRank: 0, KvFetch: hint})
	if u.GetCachedTokens() != 4*peerBS || p.Stats().Fetched != 1 {
		t.Fatalf("hinted rank 0: cached %d, peer stats %+v", u.GetCachedTokens(), p.Stats())
	}
	// The own rank's endpoint is self: unused.
	toks3 := prompt(9000, 2*peerBS+1)
	hint = api.HintToProto(simHint("sel2", inst.ControlEndpoints[0], seqHashes(toks3)))
	generateUsage(t, c, &api.GenerateRequest{Tokens: toks3, MaxTokens: 1, DpRank: 0, KvFetch: hint})
	if s := p.Stats(); s.Unused != 1 {
		t.Fatalf("self hint: %+v", s)
	}
	if s := eng.Stats(); s.TotalBlocks != 256 {
		t.Fatalf("engine stats %+v", s)
	}
}
