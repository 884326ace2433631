package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func pieces(s splitter, text string) []string {
	var out []string
	s.split(text, func(p string) bool { out = append(out, p); return true })
	return out
}

// TestSplitterMatchesRegex runs each hand-written scanner against regexp2
// interpreting the same pattern (wrapped in (?:…) so regexp2 does not pick up
// tiktoken-go's registered generated code for the bare pattern).
func TestSplitterMatchesRegex(t *testing.T) {
	extra := []string{"\x00", "\x7f", "\x1b[0m", "\u0085", "\u2028", "\u180e", "'S", "'m", "'M", "'d", "'ve", "'T", "'lL", "'Re", "'ſ", "'", "''s", "\u0301a", "a\u0301B", "ǅa", "ʰʰa", "Ab'LL", "\u00adx"}
	for pattern, kind := range knownPatterns {
		ref, err := newSplitter("(?:" + pattern + ")")
		if err != nil {
			t.Fatal(err)
		}
		fast := patternSplitter{kind: kind}
		r := rand.New(rand.NewPCG(uint64(kind), 99))
		for i := 0; i < 1500; i++ {
			var b strings.Builder
			for b.Len() < 1+r.IntN(120) {
				if r.IntN(3) == 0 {
					b.WriteString(extra[r.IntN(len(extra))])
				} else {
					b.WriteString(randomText(r, 1))
				}
			}
			text := b.String()
			got, want := pieces(fast, text), pieces(ref, text)
			if !slices.Equal(got, want) {
				t.Fatalf("pattern %d, text %q:\n got  %q\n want %q", kind, text, got, want)
			}
		}
	}
}

func TestSplitterEdgeCases(t *testing.T) {
	o := patternSplitter{kind: kindO200k}
	cases := []struct {
		text string
		want []string
	}{
		{"Hello world", []string{"Hello", " world"}},
		{"HELLOworld", []string{"HELLOworld"}},
		{"don't", []string{"don't"}},
		{"x  y", []string{"x", " ", " y"}},
		{"a \n\n b", []string{"a", " \n\n", " b"}},
		{"12345", []string{"123", "45"}},
		{"path/to\n", []string{"path", "/to", "\n"}},
		{"  ", []string{"  "}},
	}
	for _, c := range cases {
		if got := pieces(o, c.text); !slices.Equal(got, c.want) {
			t.Errorf("split(%q) = %q, want %q", c.text, got, c.want)
		}
	}
}

// TestO200kASCIIWordMatchesRegex aims at o200kASCIIWord's edges: ASCII
// words next to punctuation, digits, newlines, contractions, and non-ASCII
// letters or marks that may extend a run (where it must leave the answer to
// the general scan).
func TestO200kASCIIWordMatchesRegex(t *testing.T) {
	ref, err := newSplitter("(?:" + PatternO200k + ")")
	if err != nil {
		t.Fatal(err)
	}
	fast := patternSplitter{kind: kindO200k}
	atoms := []string{"a", "z", "A", "Z", "b", "Q", "'", "s", "S", "t", "re", "LL", " ", ".", "(", "-", "_", "@", "`", "[", "{",
		"0", "9", "\n", "\r", "\t", "é", "É", "\u0301", "ſ", "\u212a", "ǅ", "ʰ", "日", "\u00a0", "\xff", "😀"}
	r := rand.New(rand.NewPCG(5, 6))
	for i := 0; i < 20000; i++ {
		var b strings.Builder
		for n := 1 + r.IntN(12); n > 0; n-- {
			b.WriteString(atoms[r.IntN(len(atoms))])
		}
		text := b.String()
		if got, want := pieces(fast, text), pieces(ref, text); !slices.Equal(got, want) {
			t.Fatalf("text %q:\n got  %q\n want %q", text, got, want)
		}
	}
}

// lowerRunByBytes is lowerRun one byte at a time.
func lowerRunByBytes(s string, k int) int {
	for k < len(s) && s[k] >= 'a' && s[k] <= 'z' {
		k++
	}
	return k
}

// TestLowerRun checks the eight-bytes-at-a-time run against the byte loop
// on runs of every length next to every byte value (the letters' edges
// '`', '{', and bytes from 0x80 whose carries must not leak backwards).
func TestLowerRun(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	for n := 0; n <= 20; n++ {
		for b := 0; b < 256; b++ {
			run := make([]byte, n)
			for k := range run {
				run[k] = byte('a' + r.IntN(26))
			}
			s := string(run) + string([]byte{byte(b)}) + "zzzzzzzzz"
			for k := 0; k <= min(3, len(s)); k++ {
				if got, want := lowerRun(s, k), lowerRunByBytes(s, k); got != want {
					t.Fatalf("lowerRun(%q, %d) = %d, want %d", s, k, got, want)
				}
			}
		}
	}
}

func FuzzLowerRun(f *testing.F) {
	for _, s := range []string{"abcdefghij", "abc{defghijk", "abcdefg\xe1bcdefg", "`abcdefgh", "zzzzzzzzzzzzzzzzz\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for k := 0; k <= len(s); k++ {
			if got, want := lowerRun(s, k), lowerRunByBytes(s, k); got != want {
				t.Fatalf("lowerRun(%q, %d) = %d, want %d", s, k, got, want)
			}
		}
	})
}

// TestBMPClassMatchesSlow checks the plane's table, rune by rune, against
// the classes the unicode package's functions give.
func TestBMPClassMatchesSlow(t *testing.T) {
	for r := rune(0); r < 0x10000; r++ {
		if got, want := bmpClass[r], classOfSlow(r); got != want {
			t.Fatalf("class of %U = %07b, want %07b", r, got, want)
		}
	}
}

// FuzzO200kSplit checks o200k's scanner (its ASCII word, digit and
// space-before-number shortcuts included) against regexp2 running the
// pattern, on any text.
func FuzzO200kSplit(f *testing.F) {
	for _, s := range []string{"question 16001 is 7, ", "12345 ٣4 1½", " 1 22 333 4444", "a1b2 c3", ",  9\n 8", "don't 42'S", "x\u0301 9"} {
		f.Add(s)
	}
	ref, err := newSplitter("(?:" + PatternO200k + ")")
	if err != nil {
		f.Fatal(err)
	}
	fast := patternSplitter{kind: kindO200k}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := pieces(fast, s), pieces(ref, s); !slices.Equal(got, want) {
			t.Fatalf("text %q:\n got  %q\n want %q", s, got, want)
		}
	})
}
