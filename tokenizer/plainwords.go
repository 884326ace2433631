package tokenizer

import (
	_ "embed"
	"strings"
)

//go:embed plainwords.txt
var plainWords string

// PlainWordTokens is a readable output vocabulary: the ids of common,
// neutral English words, each a single token with its leading space, so a
// simulated engine drawing from them writes plain (if aimless) English
// rather than random sub-word pieces, some of them crude.
func PlainWordTokens(t Tokenizer) []uint32 {
	var ids []uint32
	for _, w := range strings.Fields(plainWords) {
		if got := t.Encode(" " + w); len(got) == 1 {
			ids = append(ids, got[0])
		}
	}
	return ids
}
