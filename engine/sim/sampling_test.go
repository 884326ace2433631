package sim

import (
	"context"
	"testing"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/kv"
)

// With a two-token vocabulary that is all stop tokens, every generation
// would end at its first token: min_tokens holds the stop back until that
// many tokens, ignore_eos until max_tokens.
func TestMinTokensAndIgnoreEOS(t *testing.T) {
	cfg := testConfig()
	cfg.VocabSize = 2
	cfg.SpeedupRatio = 0
	e := mustEngine(t, cfg)
	stops := []kv.Token{0, 1}
	for _, c := range []struct {
		smp  kv.Sampling
		n    int
		fin  kv.FinishReason
		name string
	}{
		{kv.Sampling{MaxTokens: 12, StopTokens: stops}, 1, kv.FinishStop, "stops at once"},
		{kv.Sampling{MaxTokens: 12, MinTokens: 7, StopTokens: stops}, 7, kv.FinishStop, "min_tokens"},
		{kv.Sampling{MaxTokens: 12, MinTokens: 12, StopTokens: stops}, 12, kv.FinishStop, "min = max"},
		{kv.Sampling{MaxTokens: 12, IgnoreEOS: true, StopTokens: stops}, 12, kv.FinishLength, "ignore_eos"},
	} {
		ch, err := e.Generate(context.Background(), &engine.Request{ID: c.name, Tokens: []kv.Token{1, 0, 1, 1, 0}, Sampling: c.smp})
		if err != nil {
			t.Fatal(err)
		}
		toks, last := collect(t, ch)
		if len(toks) != c.n || last.Finish != c.fin {
			t.Errorf("%s: %d tokens, finish %v; want %d, %v", c.name, len(toks), last.Finish, c.n, c.fin)
		}
	}
}

// With OutputTokens set, every generated token is one of them.
func TestOutputTokensVocabulary(t *testing.T) {
	cfg := testConfig()
	cfg.SpeedupRatio = 0
	cfg.OutputTokens = []kv.Token{5, 77, 901}
	e := mustEngine(t, cfg)
	ch, err := e.Generate(context.Background(), &engine.Request{ID: "v", Tokens: []kv.Token{1, 2, 3}, Sampling: kv.Sampling{MaxTokens: 60, Seed: 3}})
	if err != nil {
		t.Fatal(err)
	}
	toks, _ := collect(t, ch)
	seen := map[kv.Token]bool{}
	for _, tk := range toks {
		if tk != 5 && tk != 77 && tk != 901 {
			t.Fatalf("token %d outside the output vocabulary", tk)
		}
		seen[tk] = true
	}
	if len(toks) != 60 || len(seen) != 3 {
		t.Fatalf("%d tokens, %d distinct", len(toks), len(seen))
	}
	cfg.OutputTokens = []kv.Token{1000}
	if _, err := New(cfg); err == nil {
		t.Fatal("an output token outside the vocabulary was accepted")
	}
}
