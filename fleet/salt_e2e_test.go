package fleet

import (
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/worker"
)

// Two tenants send the same prompt with different cache salts through the
// live cluster (two sim workers serving their caches to each other, hint
// planning on): the second tenant shares nothing — no cached tokens on the
// worker that computed the first's, no index match, no hint, and the source
// refuses its salt domain even naming the first tenant's exact hashes. The
// same salt shares: on the same worker, and across workers by a hint.
func TestCacheSaltIsolatesTenants(t *testing.T) {
	f := startHintedFleet(t, 2, nil, worker.Config{LoadInterval: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	ctx, ws := f.ctx, f.ws
	c := f.cluster(t, router.Config{Hints: true, MaxKVUsage: 0.9}, nil)
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

	domainTurn(t, c, "", "tenant-a", toks)
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
	if got := domainTurn(t, c, "", "tenant-b", toks); got.cached != 0 {
		t.Fatalf("tenant b found %d cached tokens of tenant a's on A", got.cached)
	}
	if a.eng.Lookup(seqB) != n {
		t.Fatal("A did not compute tenant b's prompt in b's own salt domain")
	}
	// ... and again on a worker that could fetch from A: no hint, no fetch.
	c.router.UpdateLoad(b.key(), 0, 100, 0, 0)
	c.router.UpdateLoad(a.key(), 100, 100, 0, 0)
	waitFor(t, 10*time.Second, "index holds tenant b's blocks on A", func() bool { return indexDepth(localB, a.key()) == n })
	if got := domainTurn(t, c, "", "tenant-c", toks); got.cached != 0 {
		t.Fatalf("tenant c found %d cached tokens", got.cached)
	}
	if s := b.peer.Stats(); s.Fetched+s.Partial+s.Fallback != 0 {
		t.Fatalf("a hint crossed salts: B's peer stats %+v", s)
	}

	// Naming tenant a's exact hashes in another domain gets nothing from A.
	checkServesNoOtherDomain(t, ctx, a, seqA, kv.Seed("", "tenant-b"), kv.BaseSeed)

	// The same salt shares: on A, and on B through a hint from A.
	checkDomainShares(t, c, a, b, "", "tenant-a", toks, n)
}
