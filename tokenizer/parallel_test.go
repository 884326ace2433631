package tokenizer

import (
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// splitPieces is the o200k scanner's pieces of text.
func splitPieces(t *BPE, text string) []string {
	var out []string
	t.split.split(text, func(p string) bool { out = append(out, p); return true })
	return out
}

// piecesCutEverywhere splits text at every safe cut, scans each chunk on
// its own and concatenates the pieces: the strongest check of the rule.
func piecesCutEverywhere(t *BPE, text string) []string {
	var out []string
	last := 0
	for p := 1; p < len(text); p++ {
		if safeCut(text, p) {
			out = append(out, splitPieces(t, text[last:p])...)
			last = p
		}
	}
	return append(out, splitPieces(t, text[last:])...)
}

// sequentialOf is a copy of t that never encodes in chunks: the reference.
func sequentialOf(t *BPE) *BPE {
	s := *t
	s.sequential = true
	return &s
}

// parallelTexts are real and adversarial texts: the project's docs, the
// benchmark's prompt, decoded random tokens (what a synthesized trace
// prompt is made of), mixed scripts, digits, contractions, whitespace runs
// and CRLF next to letters and spaces.
func parallelTexts(t testing.TB, tok *BPE) map[string]string {
	texts := map[string]string{"bench": benchText(20000)}
	for _, f := range []string{"../docs/architecture.md", "../README.md", "../docs/benchmarks.md"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		texts[f] = strings.Repeat(string(b), 1+parallelMinBytes/len(b)) // each long enough for chunks
	}
	r := rand.New(rand.NewPCG(29, 1))
	ids := make([]uint32, 30000)
	for i := range ids {
		ids[i] = uint32(r.IntN(199000))
	}
	texts["random tokens"] = tok.Decode(ids)
	atoms := []string{"the", " ", "  ", "   ", "\t", "\n", "\r\n", "\r", " \n", "A", "Zebra", "don't", "'s", "'LL", "’s",
		"12345", "٣٤", "Ⅻ", "日本語", "한국어", "Ελληνικά", "Привет", "😀", "é", "e\u0301", "ǅ", "ʰ", "/", "//", ".", "...",
		"?!", "(", ")", "\u00a0", "\u3000", "\xff", "\xc3", "aB", "ABc", "x", "q9", "<|im_start|>", "<|im_end|>", "'"}
	var b strings.Builder
	for b.Len() < 60000 {
		b.WriteString(atoms[r.IntN(len(atoms))])
	}
	texts["atoms"] = b.String()
	return texts
}

func TestSafeCutsSplitLikeWhole(t *testing.T) {
	tok := builtinBPE(t)
	for name, text := range parallelTexts(t, tok) {
		if got, want := piecesCutEverywhere(tok, text), splitPieces(tok, text); !slices.Equal(got, want) {
			for i := range min(len(got), len(want)) {
				if got[i] != want[i] {
					t.Fatalf("%s: piece %d: cut everywhere %q, whole %q", name, i, got[i], want[i])
				}
			}
			t.Fatalf("%s: %d pieces cut everywhere, %d whole", name, len(got), len(want))
		}
	}
}

func TestParallelEncodeMatchesSequential(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	tok := builtinBPE(t)
	if !tok.parallelOK() {
		t.Fatal("o200k must be encodable in chunks")
	}
	seq := sequentialOf(tok)
	for name, text := range parallelTexts(t, tok) {
		if parallelChunks(len(text)) < 2 || len(chunkCuts(text, 4)) == 0 {
			t.Fatalf("%s: %d bytes would not be encoded in chunks", name, len(text))
		}
		if got, want := tok.Encode(text), seq.Encode(text); !slices.Equal(got, want) {
			t.Fatalf("%s: parallel %d tokens, sequential %d (or differ)", name, len(got), len(want))
		}
		want := seq.EncodeWithSpecial(text)
		if got := tok.EncodeWithSpecial(text); !slices.Equal(got, want) {
			t.Fatalf("%s: with special: parallel %d tokens, sequential %d (or differ)", name, len(got), len(want))
		}
		// Caps before, inside and after each chunk: stop where sequential stops.
		for _, max := range []int{1, len(want) / 7, len(want) / 3, len(want) / 2, len(want) - 1, len(want), len(want) + 1, 4 * len(want)} {
			g, gd := tok.EncodeUpTo(text, true, max)
			w, wd := seq.EncodeUpTo(text, true, max)
			if gd != wd || !slices.Equal(g, w) {
				t.Fatalf("%s: max %d: parallel %d tokens done=%v, sequential %d done=%v", name, max, len(g), gd, len(w), wd)
			}
		}
	}
}

func TestParallelEncodeSequentialWhenOneCPU(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	if n := parallelChunks(1 << 20); n != 1 {
		t.Fatalf("GOMAXPROCS 1: %d chunks", n)
	}
	runtime.GOMAXPROCS(4)
	if n := parallelChunks(parallelMinBytes - 1); n != 1 {
		t.Fatalf("short text: %d chunks", n)
	}
}

func TestParallelEncodeOnlyForO200kScanner(t *testing.T) {
	tok := builtinBPE(t)
	other := *tok
	other.split = patternSplitter{kind: kindCl100k}
	if other.parallelOK() {
		t.Fatal("cl100k scanner: the cut rule is not proven for it")
	}
	other = *tok
	other.addPrefixSpace = true
	if other.parallelOK() {
		t.Fatal("prefix space: a chunk would gain a space")
	}
}

func TestParallelEncodeNoGoroutineLeak(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	tok := builtinBPE(t)
	text := benchText(20000)
	before := runtime.NumGoroutine()
	for range 20 {
		tok.EncodeUpTo(text, false, 100)
		tok.Encode(text)
	}
	if after := runtime.NumGoroutine(); after > before {
		t.Fatalf("%d goroutines before, %d after", before, after)
	}
}

// FuzzParallelEncode checks the cut rule on any text: its pieces with the
// text cut at every safe point, and its encoding in 2–4 chunks (with and
// without a cap), against the sequential scan and encoder.
func FuzzParallelEncode(f *testing.F) {
	for _, s := range []string{"hello world", "don't stop me now", "a 'll b", "x \ny", "foo  bar", "A\r\n b", "日本 語 a b",
		"12 ab 34", "tab\t x", "a !b", "end ", " start", "a\u00a0b c", "mixed ÉCOLE école", "x /\n y"} {
		f.Add(s)
	}
	tok := builtinBPE(f)
	seq := sequentialOf(tok)
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := piecesCutEverywhere(tok, s), splitPieces(tok, s); !slices.Equal(got, want) {
			t.Fatalf("%q: cut everywhere %q, whole %q", s, got, want)
		}
		want := seq.encodeChunk(s)
		for n := 2; n <= 4; n++ {
			for _, max := range []int{0, len(want) / 2, len(want)} {
				// encodeState directly: EncodeUpTo's length check could answer first.
				e := &encodeState{t: tok, max: max}
				e.yield = e.piece
				if !e.encodeParallel(s, n) {
					e.t.split.split(s, e.yield)
				}
				w := &encodeState{t: seq, max: max}
				w.yield = w.piece
				seq.split.split(s, w.yield)
				if !slices.Equal(e.out, w.out) {
					t.Fatalf("%q in %d chunks, max %d: %v, sequential %v", s, n, max, e.out, w.out)
				}
			}
		}
	})
}
