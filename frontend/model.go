package frontend

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/tokenizer"
)

// NewModel builds a served model from a tokenizer and chat template. EOS ids
// are the template's end-of-turn and end-of-text tokens the vocabulary has.
func NewModel(name string, tok tokenizer.Tokenizer, tmpl tokenizer.ChatTemplate, eos ...string) (*Model, error) {
	if tmpl == nil {
		return nil, fmt.Errorf("model %s: no chat template", name)
	}
	m := &Model{
		Name:             name,
		Created:          time.Now().Unix(),
		Encode:           tok.Encode,
		NewDetokenizer:   func() Detokenizer { return tokenizer.NewDecoder(tok, true) },
		DefaultMaxTokens: 256,
		VocabSize:        tok.VocabSize(),
	}
	m.EncodeUpTo = func(text string, max int) ([]uint32, bool) { return tok.EncodeUpTo(text, false, max) }
	m.RenderChat = func(msgs []Message, max int) (string, bool, error) {
		tm := make([]tokenizer.Message, len(msgs))
		for i, msg := range msgs {
			tm[i] = tokenizer.Message{Role: msg.Role, Content: msg.Content, Name: msg.Name}
		}
		return tokenizer.RenderChat(tok, tmpl, tm, max)
	}
	m.appender = tokenizer.NewChatAppender(tok, tmpl)
	// A conversation's later turns resend its history: they tokenize only
	// what follows the longest start an earlier prompt had.
	m.prefixCache = tokenizer.NewPrefixCache(tok, PrefixCacheTokens)
	m.encodeFrom = func(rc *tokenizer.RenderedChat, salt string, max int, from *tokenizer.CutScan, save int) ([]uint32, bool, *tokenizer.CutScan, *kv.PromptHashes) {
		if c := m.prefixCache; c != nil {
			var h *kv.PromptHashes
			ids, done, _, saved := c.EncodeRendered(salt, rc, max, from, save, func(from any, reused int, _ []uint32) any {
				h = promptNote(from, reused, nil).(*kv.PromptHashes)
				return h
			})
			return ids, done, saved, h
		}
		ids, done := tok.EncodeUpTo(rc.Text(), true, max)
		return ids, done, nil, nil
	}
	m.EncodeRendered = func(text, salt string, max int) ([]uint32, bool) {
		if c := m.prefixCache; c != nil {
			ids, done, _ := c.EncodeUpTo(salt, text, max)
			return ids, done
		}
		return tok.EncodeUpTo(text, true, max)
	}
	// The next turn renders the answer defused, as user text, and the
	// template puts a marker right after it (ChatML's <|im_end|>); the
	// cache cuts there, so it finds prompt + answer. A template that
	// renders the answer otherwise (trimmed, reasoning dropped) just misses.
	m.keepAnswerFrom = func(salt, prompt, answer string, eos uint32, from *tokenizer.CutScan) {
		if c := m.prefixCache; c != nil && tok.IsSpecial(eos) {
			c.Keep(salt, prompt+tok.Defuse(answer)+tok.Piece(eos), from, promptNote)
		}
	}
	m.KeepAnswer = func(salt, prompt, answer string, eos uint32) { m.keepAnswerFrom(salt, prompt, answer, eos, nil) }
	m.EncodeChatUpTo = func(msgs []Message, max int) ([]uint32, bool, error) {
		text, over, err := m.RenderChat(msgs, max)
		if err != nil || over {
			return nil, false, err
		}
		ids, done := m.EncodeRendered(text, "", max)
		return ids, done, nil
	}
	m.EncodeChat = func(msgs []Message) ([]uint32, error) {
		ids, _, err := m.EncodeChatUpTo(msgs, 0)
		return ids, err
	}
	for _, e := range eos {
		if id, ok := tok.TokenID(e); ok {
			m.EOS = append(m.EOS, id)
		}
	}
	if len(m.EOS) == 0 {
		return nil, fmt.Errorf("model %s: none of the end tokens %v is in the vocabulary", name, eos)
	}
	return m, nil
}

// PrefixCacheTokens is how many tokens of recent chat prompts a model
// built by NewModel keeps for its prefix-tokenization cache (4 bytes each).
const PrefixCacheTokens = 4 << 20

// PrefixStats are the model's prefix-tokenization cache counts (zero
// without one).
func (m *Model) PrefixStats() tokenizer.PrefixStats {
	if m.prefixCache == nil {
		return tokenizer.PrefixStats{}
	}
	return m.prefixCache.Stats()
}

// BuiltinModel serves name with the built-in o200k tokenizer and ChatML.
func BuiltinModel(name string) (*Model, error) {
	tok, tmpl, err := tokenizer.Builtin()
	if err != nil {
		return nil, err
	}
	return NewModel(name, tok, tmpl, "<|im_end|>", "<|endoftext|>")
}

// StaticModels is a fixed set of models, safe for concurrent use; the
// cluster backend adds models as workers announce them.
type StaticModels struct {
	mu     sync.RWMutex
	models map[string]*Model
}

func (s *StaticModels) Add(m *Model) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.models == nil {
		s.models = map[string]*Model{}
	}
	s.models[m.Name] = m
}

func (s *StaticModels) Model(name string) (*Model, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	m, ok := s.models[name]
	return m, ok
}

func (s *StaticModels) Models() []*Model {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*Model, 0, len(s.models))
	for _, m := range s.models {
		out = append(out, m)
	}
	return out
}

// promptNote is the note the prefix cache keeps with a prompt's tokens
// (ids): their block hashes, known for the start reused from the entry
// whose note is from (its tokens, copied) and kept by routing once it
// hashed them. With ids (a kept answer, which no routing hashes; off the
// request path), the hashes are extended over ids' full blocks, with the
// seed and block size routing used for the start.
func promptNote(from any, reused int, ids []uint32) any {
	h := &kv.PromptHashes{}
	f, ok := from.(*kv.PromptHashes)
	if !ok {
		return h
	}
	h.Known = f.Best().Prefix(reused)
	if k := h.Known; k != nil && len(ids) >= (len(k.Local)+1)*k.BlockSize {
		local := append(slices.Clip(k.Local), kv.LocalHashes(nil, ids[len(k.Local)*k.BlockSize:], k.BlockSize, k.Seed)...)
		h.Known = &kv.BlockHashes{Seed: k.Seed, BlockSize: k.BlockSize, Local: local, Seq: kv.AppendSeqHashes(slices.Clip(k.Seq), local[len(k.Seq):])}
	}
	return h
}
