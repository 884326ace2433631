package fleet

import (
	"context"
	"errors"
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

func loraTurn(t *testing.T, c *Cluster, lora string, toks []uint32) turnResult {
	t.Helper()
	return runTurn(t, c, &kv.GenerateRequest{RequestID: fmt.Sprint("r", time.Now().UnixNano()), Model: hintedModel,
		LoRA: lora, Tokens: toks, Sampling: kv.Sampling{MaxTokens: 4, Seed: 1234}})
}

// The same prompt under two LoRA adapters of one model shares nothing: no
// cached tokens on the worker that computed the first adapter's, no hint,
// and the source refuses the other adapter's domain even for the first's
// exact hashes. The same adapter shares, on the worker and by a hint. An
// adapter no worker registered is ErrNoWorkers, and a worker refuses an
// adapter it does not serve.
func TestLoRAIsolatesAdapters(t *testing.T) {
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
		worker.Config{LoadInterval: time.Hour, Logger: slog.New(slog.DiscardHandler), LoRAs: []string{"sql-lora", "chat-lora"}})
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
	if got := c.Adapters(hintedModel); !slices.Equal(got, []string{"chat-lora", "sql-lora"}) {
		t.Fatalf("adapters %v", got)
	}

	toks := prompt(9, 1024)
	bs := sim.DefaultBlockSize
	_, seqSQL := kv.NewHasher(bs, "sql-lora", "").Blocks(toks)
	localChat, seqChat := kv.NewHasher(bs, "chat-lora", "").Blocks(toks)
	n := len(seqSQL)

	loraTurn(t, c, "sql-lora", toks)
	ai := slices.IndexFunc(ws, func(h hintedWorker) bool { return h.eng.Lookup(seqSQL) == n })
	if ai < 0 {
		t.Fatal("no worker holds the prompt under sql-lora")
	}
	a, b := ws[ai], ws[1-ai]
	waitFor(t, 10*time.Second, "index holds sql-lora's blocks", func() bool {
		return len(c.index.FindMatches(kv.LocalHashes(nil, toks, bs, kv.Seed("sql-lora", "")), nil)) == 1
	})
	if len(c.index.FindMatches(localChat, nil)) != 0 {
		t.Fatal("the index matches chat-lora's prompt against sql-lora's blocks")
	}
	// chat-lora on A, which computed sql-lora's: nothing cached.
	c.router.UpdateLoad(b.key(), 100, 100, 0, 0)
	if got := loraTurn(t, c, "chat-lora", toks); got.cached != 0 {
		t.Fatalf("chat-lora found %d of sql-lora's tokens cached on A", got.cached)
	}
	if a.eng.Lookup(seqChat) != n {
		t.Fatal("A did not compute chat-lora's prompt in its own domain")
	}
	// The base model on B, where a hint from A could serve: none crosses.
	c.router.UpdateLoad(b.key(), 0, 100, 0, 0)
	c.router.UpdateLoad(a.key(), 100, 100, 0, 0)
	if got := loraTurn(t, c, "", toks); got.cached != 0 {
		t.Fatalf("the base model found %d cached tokens", got.cached)
	}
	if s := b.peer.Stats(); s.Fetched+s.Partial+s.Fallback != 0 {
		t.Fatalf("a hint crossed adapters: B's peer stats %+v", s)
	}
	cl := transfer.NewClient(transfer.ClientOptions{})
	defer cl.Close()
	ask := make([]uint64, n)
	for i, h := range seqSQL {
		ask[i] = uint64(sim.EngineHash(h))
	}
	for _, dom := range []uint64{kv.Seed("chat-lora", ""), kv.BaseSeed} {
		res, _ := cl.Fetch(ctx, a.peer.Endpoints()[0], transfer.FetchRequest{Hashes: ask, Digest: a.peer.Digest(), Domain: dom})
		if res.Completed != 0 {
			t.Fatalf("A served %d of sql-lora's blocks to domain %x", res.Completed, dom)
		}
		res.Release()
	}

	// The same adapter shares: on A, and on B through a hint from A.
	c.router.UpdateLoad(a.key(), 0, 100, 0, 0)
	c.router.UpdateLoad(b.key(), 100, 100, 0, 0)
	if got := loraTurn(t, c, "sql-lora", toks); got.cached < (n-1)*bs {
		t.Fatalf("sql-lora's second request found %d cached tokens, want ≥ %d", got.cached, (n-1)*bs)
	}
	c.router.UpdateLoad(b.key(), 0, 100, 0, 0)
	c.router.UpdateLoad(a.key(), 100, 100, 0, 0)
	got := loraTurn(t, c, "sql-lora", toks)
	if s := b.peer.Stats(); s.Fetched != 1 || got.cached < (n-1)*bs {
		t.Fatalf("sql-lora on B: %d cached tokens, peer stats %+v; want a fetched hint", got.cached, s)
	}

	_, err = c.Generate(ctx, &kv.GenerateRequest{RequestID: "unknown-adapter", Model: hintedModel, LoRA: "nobody-lora", Tokens: toks,
		Sampling: kv.Sampling{MaxTokens: 4, Seed: 1}})
	if !errors.Is(err, kv.ErrNoWorkers) {
		t.Fatalf("an adapter no worker registered: %v, want ErrNoWorkers", err)
	}
}
