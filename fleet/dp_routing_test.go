package fleet

import (
	"io"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/worker"
	"github.com/kvmesh/kvmesh/workerclient"
)

// A worker with DP size 2 behind a Cluster: a prefix cached on rank 1 is
// indexed on {inst, 1} (its events carry rank 1), the router sends the next
// turn to rank 1, which serves it from its cache, and each rank's load
// report reaches its own router key.
func TestDPRanksRoutedByCache(t *testing.T) {
	ctx, nc, disc := controlPlane(t, 2*time.Second)
	const bs, blocks = 16, 128
	cfg := sim.DefaultConfig()
	cfg.BlockSize, cfg.Blocks, cfg.SpeedupRatio, cfg.DPSize = bs, blocks, 0, 2
	eng, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w := startWorker(t, ctx, nc, eng, worker.Config{LoadInterval: 20 * time.Millisecond})
	cl, model := startCluster(t, ctx, nc, disc, prometheus.NewRegistry())
	k0, k1 := kv.WorkerKey{Instance: w.InstanceID()}, kv.WorkerKey{Instance: w.InstanceID(), DPRank: 1}
	waitFor(t, 10*time.Second, "both ranks routed and dumped", func() bool {
		_, ok0 := cl.feeds[model.Name].LastID(k0)
		_, ok1 := cl.feeds[model.Name].LastID(k1)
		return len(cl.router.Workers(model.Name, kv.RoleAggregated)) == 2 && ok0 && ok1
	})

	// Turn 1 runs on rank 1, straight at the worker.
	turn1 := prompt(7, 10*bs)
	clients := workerclient.NewPool()
	t.Cleanup(clients.Close)
	wc, err := clients.Get(w.Instance())
	if err != nil {
		t.Fatal(err)
	}
	st, err := wc.Generate(ctx, &api.GenerateRequest{Tokens: turn1, MaxTokens: 1, DpRank: 1})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := st.Recv(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	local := kv.LocalHashes(nil, turn1, bs, kv.Seed("", ""))
	held := func() map[kv.WorkerKey]int {
		out := map[kv.WorkerKey]int{}
		for _, m := range cl.index.FindMatches(local, nil) {
			out[m.Worker] = int(m.Depth[kv.NumTiers-1])
		}
		return out
	}
	waitFor(t, 10*time.Second, "turn 1 indexed on rank 1", func() bool { return held()[k1] == 10 })
	if h := held(); h[k0] != 0 {
		t.Fatalf("index holds turn 1 on rank 0 too: %v", h)
	}

	// Turn 2 extends turn 1: routed to rank 1, which has it cached.
	res, err := generate(ctx, cl, model.Name, concat(turn1, prompt(8, 3*bs)), 2)
	if err != nil {
		t.Fatal(err)
	}
	if res.worker != k1 || res.cached < 9*bs {
		t.Fatalf("turn 2 on %+v with %d cached tokens, want rank 1 with ≥ %d", res.worker, res.cached, 9*bs)
	}

	// Blocks held on rank 1 show in rank 1's load only.
	_, seq := kv.NewHasher(bs, "", "").Blocks(turn1)
	n, release := eng.Rank(1).Pin(seq)
	defer release()
	if n != 10 {
		t.Fatalf("pinned %d blocks of turn 1 on rank 1", n)
	}
	waitFor(t, 5*time.Second, "rank 1's load report", func() bool {
		return cl.router.Load(k1).KVUsage >= float64(n)/blocks
	})
	if u := cl.router.Load(k0).KVUsage; u != 0 {
		t.Fatalf("rank 0's KV usage %g, want 0 (rank 1's load applied to rank 0?)", u)
	}
}
