package tokenizer

import (
	"fmt"
	"sync"

	tiktoken "github.com/tiktoken-go/tokenizer"
)

// Special tokens of the built-in o200k_base tokenizer. <|endoftext|> and
// <|endofprompt|> are o200k_base's own; the ChatML tokens use the ids OpenAI
// uses for GPT-4o's chat format.
const (
	O200kEndOfText   = 199999
	O200kEndOfPrompt = 200018
	O200kImStart     = 200264
	O200kImEnd       = 200265
	O200kImSep       = 200266
)

// o200kMergeable is the number of mergeable (non-special) o200k_base tokens:
// ids 0 … 199997.
const o200kMergeable = 199998

var (
	o200kOnce sync.Once
	o200kTok  *BPE
	o200kErr  error
)

// O200k returns the o200k_base tokenizer (GPT-4o's encoding) with ChatML
// special tokens. The vocabulary is compiled into the binary by
// github.com/tiktoken-go/tokenizer; nothing is downloaded. The first call
// builds the tables (about 0.1 s, ~30 MB); later calls share them.
func O200k() (*BPE, error) {
	o200kOnce.Do(func() { o200kTok, o200kErr = buildO200k() })
	return o200kTok, o200kErr
}

func buildO200k() (*BPE, error) {
	codec, err := tiktoken.Get(tiktoken.O200kBase)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: load embedded o200k_base: %w", err)
	}
	specials := []addedToken{
		{"<|endoftext|>", O200kEndOfText, true},
		{"<|endofprompt|>", O200kEndOfPrompt, true},
		{"<|im_start|>", O200kImStart, true},
		{"<|im_end|>", O200kImEnd, true},
		{"<|im_sep|>", O200kImSep, true},
	}
	t := &BPE{
		name:       "o200k_base",
		special:    make([]bool, O200kImSep+1),
		wholeFirst: true,
		split:      patternSplitter{kind: kindO200k},
	}
	// The codec keeps its table private; Decode of each id reads it out.
	one := make([]uint, 1)
	pieces := make([]string, O200kImSep+1)
	entries := make([]vocabEntry, o200kMergeable)
	for id := 0; id < o200kMergeable; id++ {
		one[0] = uint(id)
		b, err := codec.Decode(one)
		if err != nil || b == "" {
			return nil, fmt.Errorf("tokenizer: embedded o200k_base lacks token %d: %v", id, err)
		}
		pieces[id] = b
		entries[id] = vocabEntry{b, uint32(id)}
	}
	for _, s := range specials {
		pieces[s.id] = s.content
		t.special[s.id] = true
	}
	t.pieces, t.vocab = newPieceTable(pieces), newVocabTable(entries)
	for b := 0; b < 256; b++ {
		id, ok := t.vocab.get(string([]byte{byte(b)}))
		if !ok {
			return nil, fmt.Errorf("tokenizer: embedded o200k_base has no token for byte %#x", b)
		}
		t.byteID[b] = id
	}
	t.setAdded(specials)
	return t, nil
}
