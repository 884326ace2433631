package tokenizer

import (
	"regexp"
	"testing"
)

// Nearly every listed word is one o200k token, and every id decodes to a
// space and a lowercase word of the list.
func TestPlainWordTokens(t *testing.T) {
	tok, err := O200k()
	if err != nil {
		t.Fatal(err)
	}
	ids := PlainWordTokens(tok)
	if len(ids) < 300 {
		t.Fatalf("%d single-token words, want ≥ 300", len(ids))
	}
	word := regexp.MustCompile(`^ [a-z]+$`)
	seen := map[uint32]bool{}
	for _, id := range ids {
		if s := tok.Decode([]uint32{id}); !word.MatchString(s) {
			t.Errorf("id %d decodes to %q", id, s)
		}
		if seen[id] {
			t.Errorf("id %d twice", id)
		}
		seen[id] = true
	}
}
