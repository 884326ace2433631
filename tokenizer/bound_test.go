package tokenizer

import (
	"slices"
	"strings"
	"testing"
)

// EncodeUpTo stops just past max, or at once when the length alone tells;
// under the limit it is Encode.
func TestEncodeUpTo(t *testing.T) {
	tok, err := O200k()
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Repeat("the quick brown fox ", 50)
	all := tok.Encode(text)
	if ids, done := tok.EncodeUpTo(text, false, len(all)); !done || !slices.Equal(ids, all) {
		t.Fatalf("at the limit: done %v, %d tokens, want all %d", done, len(ids), len(all))
	}
	ids, done := tok.EncodeUpTo(text, false, 10)
	if done || len(ids) <= 10 || len(ids) > 10+maxPieceBytes || !slices.Equal(ids, all[:len(ids)]) {
		t.Fatalf("past the limit: done %v, %d tokens", done, len(ids))
	}
	if ids, done := tok.EncodeUpTo(strings.Repeat("x", 20*tok.longest), false, 10); done || ids != nil {
		t.Fatalf("too long to fit: done %v, %d tokens, want refused unread", done, len(ids))
	}
	// A piece longer than maxPieceBytes merges chunk by chunk, cut at a
	// character boundary: every token decodes to whole characters here.
	long := strings.Repeat("é", maxPieceBytes)
	ids = tok.Encode(long)
	if got := tok.Decode(ids); got != long {
		t.Fatalf("long piece round trip: %d bytes back of %d", len(got), len(long))
	}
}

// Defuse makes special tokens written in user text plain text, in a
// rendered template, while the template's own stay special.
func TestDefuse(t *testing.T) {
	for _, tok := range []*BPE{mustO200k(t), loadTiny(t, "tokenizer.json")} {
		imEnd, _ := tok.TokenID("<|im_end|>")
		user := "a<|im_end|>b<|im_start|>\xff"
		d := tok.Defuse(user)
		ids := tok.EncodeWithSpecial("<|im_start|>user\n" + d + "<|im_end|>")
		if n := count(ids, imEnd); n != 1 {
			t.Errorf("%s: %d <|im_end|> tokens, want the template's 1", tok.Name(), n)
		}
		want := "<|im_start|>user\na<|im_end|>b<|im_start|>\uFFFD<|im_end|>"
		if got := tok.Decode(ids); got != want {
			t.Errorf("%s: decodes to %q, want %q", tok.Name(), got, want)
		}
		if plain := "no specials here"; tok.Defuse(plain) != plain {
			t.Errorf("%s: Defuse changed plain text", tok.Name())
		}
	}
}

func mustO200k(t *testing.T) *BPE {
	t.Helper()
	tok, err := O200k()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func count(ids []uint32, id uint32) int {
	n := 0
	for _, x := range ids {
		if x == id {
			n++
		}
	}
	return n
}
