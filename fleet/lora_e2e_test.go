package fleet

import (
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/worker"
)

// The same prompt under two LoRA adapters of one model shares nothing: no
// cached tokens on the worker that computed the first adapter's, no hint,
// and the source refuses the other adapter's domain even for the first's
// exact hashes. The same adapter shares, on the worker and by a hint. An
// adapter no worker registered is ErrNoWorkers, and a worker refuses an
// adapter it does not serve.
func TestLoRAIsolatesAdapters(t *testing.T) {
	f := startHintedFleet(t, 2, nil, worker.Config{LoadInterval: time.Hour, Logger: slog.New(slog.DiscardHandler), LoRAs: []string{"sql-lora", "chat-lora"}})
	ctx, ws := f.ctx, f.ws
	c := f.cluster(t, router.Config{Hints: true, MaxKVUsage: 0.9}, nil)
	if got := c.Adapters(hintedModel); !slices.Equal(got, []string{"chat-lora", "sql-lora"}) {
		t.Fatalf("adapters %v", got)
	}

	toks := prompt(9, 1024)
	bs := sim.DefaultBlockSize
	_, seqSQL := kv.NewHasher(bs, "sql-lora", "").Blocks(toks)
	localChat, seqChat := kv.NewHasher(bs, "chat-lora", "").Blocks(toks)
	n := len(seqSQL)

	domainTurn(t, c, "sql-lora", "", toks)
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
	if got := domainTurn(t, c, "chat-lora", "", toks); got.cached != 0 {
		t.Fatalf("chat-lora found %d of sql-lora's tokens cached on A", got.cached)
	}
	if a.eng.Lookup(seqChat) != n {
		t.Fatal("A did not compute chat-lora's prompt in its own domain")
	}
	// The base model on B, where a hint from A could serve: none crosses.
	c.router.UpdateLoad(b.key(), 0, 100, 0, 0)
	c.router.UpdateLoad(a.key(), 100, 100, 0, 0)
	if got := domainTurn(t, c, "", "", toks); got.cached != 0 {
		t.Fatalf("the base model found %d cached tokens", got.cached)
	}
	if s := b.peer.Stats(); s.Fetched+s.Partial+s.Fallback != 0 {
		t.Fatalf("a hint crossed adapters: B's peer stats %+v", s)
	}
	checkServesNoOtherDomain(t, ctx, a, seqSQL, kv.Seed("chat-lora", ""), kv.BaseSeed)

	// The same adapter shares: on A, and on B through a hint from A.
	checkDomainShares(t, c, a, b, "sql-lora", "", toks, n)

	_, err := c.Generate(ctx, &kv.GenerateRequest{RequestID: "unknown-adapter", Model: hintedModel, LoRA: "nobody-lora", Tokens: toks,
		Sampling: kv.Sampling{MaxTokens: 4, Seed: 1}})
	if !errors.Is(err, kv.ErrNoWorkers) {
		t.Fatalf("an adapter no worker registered: %v, want ErrNoWorkers", err)
	}
}
