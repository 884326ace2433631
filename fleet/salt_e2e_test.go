package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/transfer"
	"github.com/kvmesh/kvmesh/worker"
)

// saltedTurn is clusterTurn for a request with a cache salt.
func saltedTurn(t *testing.T, c *Cluster, salt string, toks []uint32) turnResult {
	t.Helper()
	return runTurn(t, c, &kv.GenerateRequest{RequestID: fmt.Sprint("r", time.Now().UnixNano()), Model: hintedModel,
		CacheSalt: salt, Tokens: toks, Sampling: kv.Sampling{MaxTokens: 4, Seed: 1234}})
}

// Two tenants send the same prompt with different cache salts through the
// live cluster (two sim workers serving their caches to each other, hint
// planning on): the second tenant shares nothing — no cached tokens on the
// worker that computed the first's, no index match, no hint, and the source
// refuses its salt domain even naming the first tenant's exact hashes. The
// same salt shares: on the same worker, and across workers by a hint.
func TestCacheSaltIsolatesTenants(t *testing.T) {
	_, nc, _ := controlPlane(t, 3*time.Second)
	reg := prometheus.NewRegistry()
	pm, err := worker.NewPeerMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	disc := discovery.Config{TTL: 3 * time.Second, Memory: true}
	ws := startHintedWorkers(t, ctx, nc, disc, pm, 2, nil,
		worker.Config{LoadInterval: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	d, err := discovery.Open(ctx, nc, disc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(ctx, Config{NC: nc, Discovery: d, Models: []string{hintedModel},
		Router: router.Config{Mode: router.ModeKV, Hints: true, MaxKVUsage: 0.9}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	waitHintCapable(t, c, 2)
	indexDepth := func(local []kv.LocalHash, w kv.WorkerKey) int {
		for _, m := range c.index.FindMatches(local, nil) {
			if m.Worker == w {
				return int(m.Depth[kv.TierDevice])
			}
		}
		return 0
	}

	toks := prompt(7, 1024)
	bs := sim.DefaultBlockSize
	localA, seqA := kv.NewHasher(bs, "", "tenant-a").Blocks(toks)
	localB, seqB := kv.NewHasher(bs, "", "tenant-b").Blocks(toks)
	n := len(seqA)

	saltedTurn(t, c, "tenant-a", toks)
	ai := slices.IndexFunc(ws, func(h hintedWorker) bool { return h.eng.Lookup(seqA) == n })
	if ai < 0 {
		t.Fatal("no worker holds tenant a's prompt under a's salt")
	}
	a, b := ws[ai], ws[1-ai]
	waitFor(t, 10*time.Second, "index holds tenant a's blocks on A", func() bool { return indexDepth(localA, a.key()) == n })
	if len(c.index.FindMatches(localB, nil)) != 0 {
		t.Fatal("the index matches tenant b's prompt against tenant a's blocks")
	}

	// Tenant b, same prompt, routed to A (A is the only worker with room)...
	c.router.UpdateLoad(b.key(), 100, 100, 0, 0)
	if got := saltedTurn(t, c, "tenant-b", toks); got.cached != 0 {
		t.Fatalf("tenant b found %d cached tokens of tenant a's on A", got.cached)
	}
	if a.eng.Lookup(seqB) != n {
		t.Fatal("A did not compute tenant b's prompt in b's own salt domain")
	}
	// ... and again on a worker that could fetch from A: no hint, no fetch.
	c.router.UpdateLoad(b.key(), 0, 100, 0, 0)
	c.router.UpdateLoad(a.key(), 100, 100, 0, 0)
	waitFor(t, 10*time.Second, "index holds tenant b's blocks on A", func() bool { return indexDepth(localB, a.key()) == n })
	if got := saltedTurn(t, c, "tenant-c", toks); got.cached != 0 {
		t.Fatalf("tenant c found %d cached tokens", got.cached)
	}
	if s := b.peer.Stats(); s.Fetched+s.Partial+s.Fallback != 0 {
		t.Fatalf("a hint crossed salts: B's peer stats %+v", s)
	}

	// Naming tenant a's exact hashes in another domain gets nothing from A.
	cl := transfer.NewClient(transfer.ClientOptions{})
	defer cl.Close()
	ask := make([]uint64, n)
	for i, h := range seqA {
		ask[i] = uint64(sim.EngineHash(h))
	}
	for _, dom := range []uint64{kv.Seed("", "tenant-b"), kv.BaseSeed} {
		res, _ := cl.Fetch(ctx, a.peer.Endpoints()[0], transfer.FetchRequest{Hashes: ask, Digest: a.peer.Digest(), Domain: dom})
		if res.Completed != 0 {
			t.Fatalf("A served %d of tenant a's blocks to domain %x", res.Completed, dom)
		}
		res.Release()
	}

	// The same salt shares: on A, and on B through a hint from A.
	c.router.UpdateLoad(a.key(), 0, 100, 0, 0)
	if got := saltedTurn(t, c, "tenant-a", toks); got.cached < (n-1)*bs {
		t.Fatalf("tenant a's second request found %d cached tokens, want ≥ %d", got.cached, (n-1)*bs)
	}
	c.router.UpdateLoad(a.key(), 100, 100, 0, 0)
	got := saltedTurn(t, c, "tenant-a", toks)
	if s := b.peer.Stats(); s.Fetched != 1 || got.cached < (n-1)*bs {
		t.Fatalf("tenant a on B: %d cached tokens, peer stats %+v; want a fetched hint", got.cached, s)
	}
}
