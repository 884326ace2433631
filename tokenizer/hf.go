package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/dlclark/regexp2/v2"
	"golang.org/x/text/unicode/norm"
)

// LoadHF loads a Hugging Face tokenizer.json (byte-level BPE) and, when
// configPath is not empty, the chat template and bos/eos tokens from its
// tokenizer_config.json. With an empty configPath the template is nil.
//
// Supported: model BPE with vocab and merges (string "a b" or pair form),
// ignore_merges; added tokens (special or not); normalizer null/NFC;
// pre-tokenizers ByteLevel (use_regex, add_prefix_space), Split (Regex or
// String pattern, Isolated), Digits, and Sequences of these. Anything else
// (SentencePiece-style Metaspace/byte_fallback models, other normalizers) is
// rejected with an error naming it, rather than tokenized wrongly.
// Post-processors (e.g. Llama-3 prepending BOS) are not applied: chat
// templates write BOS themselves, and Encode is plain text.
func LoadHF(tokenizerJSONPath, configPath string) (*BPE, ChatTemplate, error) {
	data, err := os.ReadFile(tokenizerJSONPath)
	if err != nil {
		return nil, nil, fmt.Errorf("tokenizer: %w", err)
	}
	name := filepath.Base(filepath.Dir(tokenizerJSONPath))
	tok, err := ParseHF(name, data)
	if err != nil {
		return nil, nil, fmt.Errorf("tokenizer: %s: %w", tokenizerJSONPath, err)
	}
	if configPath == "" {
		return tok, nil, nil
	}
	tmpl, err := LoadChatTemplate(configPath)
	if err != nil {
		return nil, nil, err
	}
	return tok, tmpl, nil
}

type hfJSON struct {
	AddedTokens []struct {
		ID      uint32 `json:"id"`
		Content string `json:"content"`
		Special bool   `json:"special"`
	} `json:"added_tokens"`
	Normalizer   json.RawMessage `json:"normalizer"`
	PreTokenizer json.RawMessage `json:"pre_tokenizer"`
	Decoder      json.RawMessage `json:"decoder"`
	Model        struct {
		Type                    string            `json:"type"`
		Vocab                   map[string]uint32 `json:"vocab"`
		Merges                  json.RawMessage   `json:"merges"`
		IgnoreMerges            bool              `json:"ignore_merges"`
		ByteFallback            bool              `json:"byte_fallback"`
		ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
		EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	} `json:"model"`
}

type hfComponent struct {
	Type           string          `json:"type"`
	AddPrefixSpace bool            `json:"add_prefix_space"`
	UseRegex       *bool           `json:"use_regex"`
	Pattern        json.RawMessage `json:"pattern"`
	Behavior       string          `json:"behavior"`
	Invert         bool            `json:"invert"`
	Individual     bool            `json:"individual_digits"`
	Pretokenizers  []hfComponent   `json:"pretokenizers"`
	Normalizers    []hfComponent   `json:"normalizers"`
}

// byteLevelDecode maps GPT-2's printable stand-ins back to bytes: printable
// Latin-1 bytes stand for themselves, the other 68 bytes for U+0100 onwards.
var byteLevelDecode, byteLevelEncode = func() (map[rune]byte, [256]rune) {
	dec := make(map[rune]byte, 256)
	var enc [256]rune
	n := 0
	for b := 0; b < 256; b++ {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		r := rune(b)
		if !printable {
			r = rune(256 + n)
			n++
		}
		dec[r] = byte(b)
		enc[b] = r
	}
	return dec, enc
}()

// fromByteLevel converts a vocab string to raw bytes; a rune outside the
// byte-level alphabet keeps its UTF-8 bytes.
func fromByteLevel(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		if c, ok := byteLevelDecode[r]; ok {
			b.WriteByte(c)
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// ParseHF builds a tokenizer from the contents of a tokenizer.json.
func ParseHF(name string, data []byte) (*BPE, error) {
	var f hfJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("parse tokenizer.json: %w", err)
	}
	if f.Model.Type != "BPE" && !(f.Model.Type == "" && f.Model.Vocab != nil) {
		return nil, fmt.Errorf("model type %q is not supported (only byte-level BPE)", f.Model.Type)
	}
	if f.Model.ByteFallback {
		return nil, fmt.Errorf("byte_fallback BPE (SentencePiece style) is not supported, only byte-level BPE")
	}
	if p := f.Model.ContinuingSubwordPrefix; p != nil && *p != "" {
		return nil, fmt.Errorf("continuing_subword_prefix %q is not supported", *p)
	}
	if p := f.Model.EndOfWordSuffix; p != nil && *p != "" {
		return nil, fmt.Errorf("end_of_word_suffix %q is not supported", *p)
	}
	if len(f.Model.Vocab) == 0 {
		return nil, fmt.Errorf("model has an empty vocab")
	}
	t := &BPE{name: name, wholeFirst: f.Model.IgnoreMerges}

	byteLevel := false
	if err := t.setPreTokenizer(f.PreTokenizer, &byteLevel); err != nil {
		return nil, err
	}
	var dec hfComponent
	if len(f.Decoder) > 0 && string(f.Decoder) != "null" {
		if err := json.Unmarshal(f.Decoder, &dec); err == nil && dec.Type == "ByteLevel" {
			byteLevel = true
		}
	}
	if !byteLevel {
		return nil, fmt.Errorf("no ByteLevel pre-tokenizer or decoder: only byte-level BPE is supported")
	}
	if err := t.setNormalizer(f.Normalizer); err != nil {
		return nil, err
	}

	maxID := uint32(0)
	for _, id := range f.Model.Vocab {
		maxID = max(maxID, id)
	}
	for _, a := range f.AddedTokens {
		maxID = max(maxID, a.ID)
	}
	if maxID >= 1<<24 {
		return nil, fmt.Errorf("token id %d is implausibly large", maxID)
	}
	pieces := make([]string, maxID+1)
	t.special = make([]bool, maxID+1)
	entries := make([]vocabEntry, 0, len(f.Model.Vocab))
	for s, id := range f.Model.Vocab {
		raw := fromByteLevel(s)
		pieces[id] = raw
		entries = append(entries, vocabEntry{raw, id})
	}
	t.vocab = newVocabTable(entries)
	for b := 0; b < 256; b++ {
		id, ok := t.vocab.get(string([]byte{byte(b)}))
		if !ok {
			return nil, fmt.Errorf("vocab has no token for byte %#x (%q): not a byte-level vocabulary", b, string(byteLevelEncode[b]))
		}
		t.byteID[b] = id
	}

	pairs, err := parseMerges(f.Model.Merges)
	if err != nil {
		return nil, err
	}
	t.merges = make(map[uint64]uint64, len(pairs))
	for rank, p := range pairs {
		a, okA := f.Model.Vocab[p[0]]
		b, okB := f.Model.Vocab[p[1]]
		r, okR := f.Model.Vocab[p[0]+p[1]]
		if !okA || !okB || !okR {
			return nil, fmt.Errorf("merge %d (%q %q) refers to tokens missing from the vocab", rank, p[0], p[1])
		}
		key := uint64(a)<<32 | uint64(b)
		if _, dup := t.merges[key]; !dup { // the first (lowest-rank) occurrence wins
			t.merges[key] = uint64(rank)<<32 | uint64(r)
		}
	}

	added := make([]addedToken, 0, len(f.AddedTokens))
	for _, a := range f.AddedTokens {
		pieces[a.ID] = a.Content
		t.special[a.ID] = a.Special
		added = append(added, addedToken{content: a.Content, id: a.ID, special: a.Special})
	}
	t.pieces = newPieceTable(pieces)
	t.setAdded(added)
	return t, nil
}

func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var asStrings []string
	if err := json.Unmarshal(raw, &asStrings); err == nil {
		out := make([][2]string, len(asStrings))
		for i, m := range asStrings {
			a, b, ok := strings.Cut(m, " ")
			if !ok || a == "" || b == "" || strings.Contains(b, " ") {
				return nil, fmt.Errorf("merge %d %q is not two space-separated tokens", i, m)
			}
			out[i] = [2]string{a, b}
		}
		return out, nil
	}
	var asPairs [][]string
	if err := json.Unmarshal(raw, &asPairs); err != nil {
		return nil, fmt.Errorf("merges are neither strings nor pairs: %w", err)
	}
	out := make([][2]string, len(asPairs))
	for i, p := range asPairs {
		if len(p) != 2 {
			return nil, fmt.Errorf("merge %d has %d parts, want 2", i, len(p))
		}
		out[i] = [2]string{p[0], p[1]}
	}
	return out, nil
}

func (t *BPE) setNormalizer(raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var n hfComponent
	if err := json.Unmarshal(raw, &n); err != nil {
		return fmt.Errorf("parse normalizer: %w", err)
	}
	list := []hfComponent{n}
	if n.Type == "Sequence" {
		list = n.Normalizers
	}
	for _, c := range list {
		if c.Type != "NFC" {
			return fmt.Errorf("normalizer %q is not supported (only NFC)", c.Type)
		}
		t.normalize = norm.NFC.String
	}
	return nil
}

type wholeSplitter struct{}

func (wholeSplitter) split(text string, yield func(string) bool) bool { return yield(text) }

func (t *BPE) setPreTokenizer(raw json.RawMessage, byteLevel *bool) error {
	t.split = wholeSplitter{}
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var p hfComponent
	if err := json.Unmarshal(raw, &p); err != nil {
		return fmt.Errorf("parse pre_tokenizer: %w", err)
	}
	list := []hfComponent{p}
	if p.Type == "Sequence" {
		list = p.Pretokenizers
	}
	var seq sequenceSplitter
	for _, c := range list {
		switch c.Type {
		case "ByteLevel":
			*byteLevel = true
			t.addPrefixSpace = c.AddPrefixSpace
			if c.UseRegex == nil || *c.UseRegex {
				seq = append(seq, patternSplitter{kind: kindGPT2})
			}
		case "Split":
			if c.Behavior != "Isolated" || c.Invert {
				return fmt.Errorf("Split pre-tokenizer with behavior %q invert=%v is not supported (only Isolated)", c.Behavior, c.Invert)
			}
			var pat struct {
				Regex  *string `json:"Regex"`
				String *string `json:"String"`
			}
			if err := json.Unmarshal(c.Pattern, &pat); err != nil {
				return fmt.Errorf("parse Split pattern: %w", err)
			}
			var expr string
			switch {
			case pat.Regex != nil:
				expr = *pat.Regex
			case pat.String != nil:
				expr = regexp2.Escape(*pat.String)
			default:
				return fmt.Errorf("Split pre-tokenizer has no pattern")
			}
			s, err := newSplitter(expr)
			if err != nil {
				return err
			}
			seq = append(seq, s)
		case "Digits":
			expr := `\p{N}+`
			if c.Individual {
				expr = `\p{N}`
			}
			s, err := newSplitter(expr)
			if err != nil {
				return err
			}
			seq = append(seq, s)
		default:
			return fmt.Errorf("pre-tokenizer %q is not supported", c.Type)
		}
	}
	switch len(seq) {
	case 0:
	case 1:
		t.split = seq[0]
	default:
		t.split = seq
	}
	return nil
}
