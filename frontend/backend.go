package frontend

import (
	"context"

	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/tokenizer"
)

// Backend runs preprocessed (tokenized) requests and streams their tokens
// back; errors wrap kv.ErrWorkerLost (migrate), kv.ErrRejected (400),
// kv.ErrNoWorkers, *kv.BusyError or kv.ErrCredentials (503). The frontend knows nothing of
// workers: cmd/kvmesh hands it the fleet.
type Backend interface {
	Generate(ctx context.Context, req *kv.GenerateRequest) (kv.TokenStream, error)
}

// ContextLimiter is a Backend that knows how many tokens, prompt plus
// completion, the workers of a model can hold; the frontend checks requests
// against it before routing and /v1/models advertises it.
type ContextLimiter interface {
	MaxContext(model string) int // 0: unknown
}

// AdapterLister is a Backend that knows the LoRA adapters its workers
// serve on a model: a request names one in its model field, and /v1/models
// lists them.
type AdapterLister interface {
	Adapters(model string) []string
}

// Model is one served model with its preprocessing.
type Model struct {
	Name    string
	Created int64
	// LoRA and Base are set on the copy the frontend makes for a request
	// naming a LoRA adapter: Name and LoRA are the adapter, Base the served
	// model it runs on (whose preprocessing the copy shares).
	LoRA, Base string
	// Encode tokenizes a plain-text prompt.
	Encode func(text string) []uint32
	// EncodeChat renders the chat template (with the generation prompt) and
	// tokenizes it; special tokens come only from the template.
	EncodeChat func(msgs []Message) ([]uint32, error)
	// EncodeUpTo and EncodeChatUpTo, when set, are Encode and EncodeChat
	// that stop once past max tokens (done false): the frontend passes the
	// context limit, so an oversized prompt is refused at the cost of
	// tokenizing the limit, not the prompt.
	EncodeUpTo     func(text string, max int) (ids []uint32, done bool)
	EncodeChatUpTo func(msgs []Message, max int) (ids []uint32, done bool, err error)
	// RenderChat and EncodeRendered, when both are set, are
	// EncodeChatUpTo's two halves, which the frontend times apart: the
	// template's text (over: the messages' length alone is past max), and
	// its tokens. EncodeRendered reuses tokens only of prompts with the
	// same cache salt (a tenant's), and the ids it returns may be shared
	// with its cache: nothing writes to a prompt.
	RenderChat     func(msgs []Message, max int) (text string, over bool, err error)
	EncodeRendered func(text, salt string, max int) (ids []uint32, done bool)
	// KeepAnswer, when set, is given a finished chat turn after its
	// response: the prompt as RenderChat rendered it, the answer's text and
	// the end token that ended it. A conversation's next turn resends the
	// answer; a model with a prefix cache tokenizes prompt and answer
	// through it here, off the next request's path.
	KeepAnswer func(salt, prompt, answer string, eos uint32)
	// NewDetokenizer returns an incremental, UTF-8-safe decoder.
	NewDetokenizer func() Detokenizer
	// EOS token ids end a generation with finish reason "stop".
	EOS []uint32
	// MaxContext bounds prompt + completion tokens (0: unbounded); a
	// ContextLimiter backend may bound them further.
	MaxContext int
	// VocabSize bounds the token ids a prompt may hold (0: unchecked).
	VocabSize int
	// DefaultMaxTokens applies when the request sets no limit.
	DefaultMaxTokens int

	prefixCache *tokenizer.PrefixCache // NewModel's, for PrefixStats
	// appender renders what RenderChat does, after a rendered start of the
	// conversation (NewModel's, for a template that renders per message).
	appender *tokenizer.ChatAppender
	// encodeFrom is EncodeRendered scanning text for the prefix cache's
	// cuts from where an earlier scan of the same start stood (nil: the
	// start); it returns the scan at offset save and the block hashes the
	// prompt's tokens carry to routing (nil: none) (NewModel's).
	encodeFrom func(rc *tokenizer.RenderedChat, salt string, max int, from *tokenizer.CutScan, save int) ([]uint32, bool, *tokenizer.CutScan, *kv.PromptHashes)
	// keepAnswerFrom is KeepAnswer scanning from where the prompt's scan
	// stood (encodeFrom's; nil: the start).
	keepAnswerFrom func(salt, prompt, answer string, eos uint32, from *tokenizer.CutScan)
}

// base is the served model a request for m goes to.
func (m *Model) base() string {
	if m.Base != "" {
		return m.Base
	}
	return m.Name
}

// Detokenizer turns a token stream into text without splitting a UTF-8
// character across pieces.
type Detokenizer interface {
	Add(id uint32) string
	Flush() string
}

// ModelSource lists the models the frontend serves.
type ModelSource interface {
	Model(name string) (*Model, bool)
	Models() []*Model
}
