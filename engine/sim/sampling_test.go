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
