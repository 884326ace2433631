// Package tokenizer turns text into token ids and back for the frontend:
// the built-in o200k_base encoding (vocabulary embedded, no downloads),
// Hugging Face byte-level BPE tokenizer.json files, Jinja chat templates from
// tokenizer_config.json, incremental UTF-8-safe detokenization for streaming
// and a stop-sequence matcher.
//
// Token ids are uint32, as in kv. Decoding never fails: ids the vocabulary
// does not have decode to the empty string.
//
// It imports nothing of kvmesh.
package tokenizer

import "strings"

// Tokenizer encodes text to token ids and back. Implementations are safe for
// concurrent use.
type Tokenizer interface {
	// Encode tokenizes plain text; special tokens written in it are not
	// recognised (they become ordinary text tokens).
	Encode(text string) []uint32
	// EncodeWithSpecial tokenizes text where special tokens written
	// literally (as in a rendered chat template) become their ids, but for
	// those Defuse marked.
	EncodeWithSpecial(text string) []uint32
	// EncodeUpTo is Encode (special false) or EncodeWithSpecial (true)
	// stopped once past max tokens (max ≤ 0: no limit); done is false when
	// it stopped, ids then being the start read so far.
	EncodeUpTo(text string, special bool, max int) (ids []uint32, done bool)
	// Defuse marks the special tokens written in user text so that
	// EncodeWithSpecial reads them as plain text.
	Defuse(s string) string
	// Decode concatenates the tokens' bytes; unknown ids contribute "".
	Decode(ids []uint32) string
	// Piece is the raw bytes of one token ("" when unknown); possibly a
	// partial UTF-8 sequence.
	Piece(id uint32) string
	// IsSpecial reports whether id is a special token (chat markers, EOS).
	IsSpecial(id uint32) bool
	// TokenID looks up a special or added token by its text.
	TokenID(content string) (uint32, bool)
	// VocabSize is one past the largest id; ids in [0, VocabSize) may still
	// be unused and decode to "".
	VocabSize() int
	// Name identifies the encoding or model.
	Name() string
}

// Message is one chat message as the chat template sees it.
type Message struct {
	Role       string     `json:"role"`
	Content    string     `json:"content"`
	Name       string     `json:"name,omitempty"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
}

// ToolCall is an assistant's function call, in OpenAI's shape.
type ToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"` // "function"
	Function FunctionCall `json:"function"`
}

// FunctionCall names a function and carries its JSON-encoded arguments.
type FunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// ChatTemplate renders chat messages into the prompt text a model expects.
type ChatTemplate interface {
	// Render returns the prompt; with addGenerationPrompt it ends with the
	// opening of the assistant's turn. Encode it with EncodeWithSpecial.
	Render(messages []Message, addGenerationPrompt bool) (string, error)
}

// EncodeChat renders msgs with tmpl (with the generation prompt) and
// tokenizes the prompt, stopping once past max tokens (max ≤ 0: no limit;
// done false then). Only the template's own text yields special tokens:
// every string of the messages is defused first, so a "<|im_end|>" in a
// message's content is text, not the end of its turn.
func EncodeChat(tok Tokenizer, tmpl ChatTemplate, msgs []Message, max int) (ids []uint32, done bool, err error) {
	text, over, err := RenderChat(tok, tmpl, msgs, max)
	if err != nil || over {
		return nil, false, err
	}
	ids, done = tok.EncodeUpTo(text, true, max)
	return ids, done, nil
}

// RenderChat is EncodeChat's first half: the defused messages rendered
// (encode the text with EncodeUpTo(text, true, max) or a PrefixCache).
// over is true, and the text empty, when the messages' length alone tells
// they yield more than max tokens.
func RenderChat(tok Tokenizer, tmpl ChatTemplate, msgs []Message, max int) (text string, over bool, err error) {
	if b, ok := tok.(lengthBounded); ok {
		n := 0
		for _, m := range msgs {
			n += len(strings.TrimSpace(m.Content)) // templates may trim; none drops more
		}
		if b.lengthOver(n, max) {
			return "", true, nil
		}
	}
	safe := defuseMessages(tok, msgs)
	text, err = tmpl.Render(safe, true)
	return text, false, err
}

// defuseMessages is msgs with every string defused (Tokenizer.Defuse).
func defuseMessages(tok Tokenizer, msgs []Message) []Message {
	safe := make([]Message, len(msgs))
	for i, m := range msgs {
		safe[i] = Message{Role: tok.Defuse(m.Role), Content: tok.Defuse(m.Content), Name: tok.Defuse(m.Name), ToolCallID: tok.Defuse(m.ToolCallID)}
		if len(m.ToolCalls) > 0 {
			safe[i].ToolCalls = make([]ToolCall, len(m.ToolCalls))
			for j, c := range m.ToolCalls {
				safe[i].ToolCalls[j] = ToolCall{ID: tok.Defuse(c.ID), Type: tok.Defuse(c.Type),
					Function: FunctionCall{Name: tok.Defuse(c.Function.Name), Arguments: tok.Defuse(c.Function.Arguments)}}
			}
		}
	}
	return safe
}

// lengthBounded is a Tokenizer that can tell from a text's length alone
// that it yields more than max tokens (BPE).
type lengthBounded interface {
	lengthOver(n, max int) bool
}

// Builtin returns the built-in model's tokenizer (o200k_base with ChatML
// special tokens) and its ChatML template. It fails only if the embedded
// vocabulary is corrupt, which a unit test rules out.
func Builtin() (Tokenizer, ChatTemplate, error) {
	t, err := O200k()
	if err != nil {
		return nil, nil, err
	}
	return t, ChatML{}, nil
}
