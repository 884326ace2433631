package frontend

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/tokenizer"
)

// hashingBackend checks the block hashes a request carries (Hashes.Known)
// against a fresh hashing of its tokens, then keeps the whole prompt's as
// routing does (fleet's routeLeg), for the block size of its salt.
type hashingBackend struct {
	answerBackend
	t     *testing.T
	bs    map[string]int
	known []int // per request, the blocks its Known held
}

func (b *hashingBackend) Generate(ctx context.Context, req *kv.GenerateRequest) (kv.TokenStream, error) {
	seed, bs := kv.Seed(req.LoRA, req.CacheSalt), b.bs[req.CacheSalt]
	n := 0
	if h := req.Hashes.KnownHashes(); h != nil {
		n = len(h.Local)
		want := kv.LocalHashes(nil, req.Tokens[:min(len(req.Tokens), n*h.BlockSize)], h.BlockSize, h.Seed)
		if h.Seed != seed || h.BlockSize != bs || !slices.Equal(h.Local, want) || !slices.Equal(h.Seq, kv.SeqHashes(nil, want)) {
			b.t.Errorf("request of %d tokens under %q: known hashes (%d blocks of %d) are not its tokens'", len(req.Tokens), req.CacheSalt, n, h.BlockSize)
		}
	}
	b.known = append(b.known, n)
	local := kv.LocalHashes(nil, req.Tokens, bs, seed)
	req.Hashes.Keep(kv.BlockHashes{Seed: seed, BlockSize: bs, Local: local, Seq: kv.SeqHashes(nil, local)})
	return b.answerBackend.Generate(ctx, req)
}

// A conversation's later turn carries the block hashes routing made for
// the turn before, for the tokens the prefix cache reused (the previous
// prompt and its kept answer): each is its tokens' own, under its salt;
// another tenant's turn with the same text carries none of them.
func TestPromptHashesCarried(t *testing.T) {
	m, err := BuiltinModel("m")
	if err != nil {
		t.Fatal(err)
	}
	tok, _, _ := tokenizer.Builtin()
	m.prefixCache.Verify(0)
	eos, _ := tok.TokenID("<|im_end|>")
	answer := "The answer is 42, as everyone knows. " + strings.Repeat("Really. ", 40)
	be := &hashingBackend{answerBackend: answerBackend{ids: tok.Encode(answer), eos: eos}, t: t, bs: map[string]int{"a": 16, "b": 64, "c": 16}}
	reg := prometheus.NewRegistry()
	s := New(DefaultConfig(), be, models{m}, reg, reg)
	serve := func(body string) { postChatOK(t, s, body) }
	msgs := map[string][]string{}
	for turn := 1; turn <= 5; turn++ {
		for _, salt := range []string{"a", "b"} {
			msgs[salt] = append(msgs[salt], "user", "Question "+strconv.Itoa(turn)+": "+strings.Repeat("why so? ", 60))
			before := len(be.prompts)
			serve(chatBody(turn%2 == 0, salt, msgs[salt]...))
			if turn > 1 {
				// The turn before's prompt and answer (its end token not:
				// the cache cuts before it).
				prev := len(be.prompts[before-2]) + len(be.ids)
				if got := be.known[before]; got != prev/be.bs[salt] {
					t.Fatalf("turn %d under %q carried %d blocks of %d; the turn before's prompt and answer have %d", turn, salt, got, be.bs[salt], prev/be.bs[salt])
				}
			}
			msgs[salt] = append(msgs[salt], "assistant", answer)
		}
	}
	// A branch: the last answer edited, then a question. The prefix cache
	// reuses the history before the answer; what is carried is that
	// history's, not the kept answer's blocks past it.
	branch := slices.Clone(msgs["a"])
	branch[len(branch)-1] = "No: 41. " + strings.Repeat("Surely. ", 40)
	serve(chatBody(true, "a", append(branch, "user", "Sure?")...))
	if got := be.known[len(be.known)-1]; got == 0 {
		t.Fatal("the branch carried nothing of its history")
	}
	// The same conversation under another salt: nothing carried.
	serve(chatBody(false, "c", msgs["a"][:len(msgs["a"])-2]...))
	if got := be.known[len(be.known)-1]; got != 0 {
		t.Fatalf("another salt's request carried %d blocks", got)
	}
}
