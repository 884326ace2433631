package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	tiktoken "github.com/tiktoken-go/tokenizer"
)

// encodeUncached is Encode of a text without added tokens, less the piece
// cache: every pre-token merged on its own, fresh scratch each time.
func encodeUncached(t *BPE, text string) []uint32 {
	out := []uint32{}
	if t.normalize != nil {
		text = t.normalize(text)
	}
	if t.addPrefixSpace && text != "" && text[0] != ' ' {
		text = " " + text
	}
	t.split.split(text, func(piece string) bool {
		for len(piece) > 0 {
			cut := min(len(piece), maxPieceBytes)
			if cut < len(piece) {
				for cut > maxPieceBytes-4 && piece[cut]&0xC0 == 0x80 {
					cut--
				}
			}
			p := piece[:cut]
			piece = piece[cut:]
			if t.wholeFirst {
				if id, ok := t.vocab.get(p); ok {
					out = append(out, id)
					continue
				}
			}
			var s mergeScratch
			out = t.bytePairMerge(out, p, &s)
		}
		return true
	})
	return out
}

// cacheText is a long text whose multi-token words repeat and overflow the
// cache: nwords random lowercase "words" (mostly not tokens) and mixed
// atoms, drawn again and again.
func cacheText(r *rand.Rand, nwords, n int) string {
	words := make([]string, nwords)
	for i := range words {
		b := make([]byte, 3+r.IntN(10))
		for k := range b {
			b[k] = "etaoinshrdlucmfwypvbgkqjxz"[r.IntN(26)]
		}
		words[i] = string(b)
	}
	var b strings.Builder
	for b.Len() < n {
		if r.IntN(4) == 0 {
			b.WriteString(randomText(r, 1))
		} else {
			b.WriteByte(' ')
			b.WriteString(words[r.IntN(nwords)])
		}
	}
	return b.String()
}

// TestPieceCacheMatchesUncached checks Encode (cache made after
// pieceCacheAfter merged pieces, filled, then full) against per-piece
// merging with no cache, for o200k and the tiny HF models, and o200k
// against tiktoken-go too.
func TestPieceCacheMatchesUncached(t *testing.T) {
	o200k := builtinBPE(t)
	ref, err := tiktoken.Get(tiktoken.O200kBase)
	if err != nil {
		t.Fatal(err)
	}
	toks := map[string]*BPE{"o200k": o200k, "tiny": loadTiny(t, "tokenizer.json"), "tiny_gpt2": loadTiny(t, "tokenizer_gpt2.json")}
	r := rand.New(rand.NewPCG(11, 12))
	for _, c := range []struct{ words, n int }{{5, 2000}, {200, 20000}, {6000, 120000}} {
		text := cacheText(r, c.words, c.n)
		for name, tok := range toks {
			got, want := tok.Encode(text), encodeUncached(tok, text)
			if !slices.Equal(got, want) {
				t.Fatalf("%s, %d words: cached encoding differs from uncached (%d vs %d tokens)", name, c.words, len(got), len(want))
			}
		}
		if strings.ContainsAny(text, "\x7f") {
			continue
		}
		want, _, err := ref.Encode(text)
		if err != nil {
			t.Fatal(err)
		}
		got := o200k.Encode(text)
		if len(got) != len(want) {
			t.Fatalf("%d words: %d tokens, tiktoken-go %d", c.words, len(got), len(want))
		}
		for k := range got {
			if uint(got[k]) != want[k] {
				t.Fatalf("%d words: token %d = %d, tiktoken-go %d", c.words, k, got[k], want[k])
			}
		}
	}
}

// FuzzPieceCache repeats the input (so its pieces are cached and then read
// back) and checks the result against uncached merging.
func FuzzPieceCache(f *testing.F) {
	for _, s := range []string{"hello world", "Kubernetes NVIDIA's TensorRT-LLM", "日本語 😀 don't", "aaaaaaaa bbbb", "x\n\n  y"} {
		f.Add(s)
	}
	tok := builtinBPE(f)
	f.Fuzz(func(t *testing.T, s string) {
		text := strings.Repeat(s+" ", pieceCacheAfter+2)
		if got, want := tok.Encode(text), encodeUncached(tok, text); !slices.Equal(got, want) {
			t.Fatalf("%q: cached %v, uncached %v", s, got, want)
		}
	})
}
