package frontend

import (
	"context"
	"errors"

	"github.com/kvmesh/kvmesh/kv"
)

// Backend runs preprocessed (tokenized) requests: the router picks a worker
// and the request plane streams its tokens back. The frontend knows nothing
// of workers; kvmesh's wiring implements this over router and gRPC.
type Backend interface {
	// Generate's errors the handler maps to 503s are the router's own:
	// *router.BusyError (every worker busy) and router.ErrNoWorkers.
	Generate(ctx context.Context, req *GenerateRequest) (TokenStream, error)
}

// GenerateRequest is what reaches the router: tokens and sampling only. It
// has no field for client routing hints, so none can reach a worker.
type GenerateRequest struct {
	RequestID string
	Model     string
	Tokens    []uint32
	kv.Sampling
	// Attempt counts migrations: 0 for the first try.
	Attempt int
}

// TokenStream is one generation's output.
type TokenStream interface {
	// Recv returns the next chunk. After the chunk whose Finish is set it
	// returns io.EOF. An error wrapping ErrWorkerLost means the worker died
	// mid-stream and the request may be migrated.
	Recv() (TokenChunk, error)
	Close() error
}

// TokenChunk is a piece of output. The final chunk sets Finish (stop or
// length) and the usage fields.
type TokenChunk struct {
	Tokens       []uint32
	Finish       kv.FinishReason
	PromptTokens int
	CachedTokens int
}

// ErrWorkerLost marks a failure of the worker (not of the request): the
// frontend migrates the request to another worker.
var ErrWorkerLost = errors.New("worker lost")

// ErrRejected marks a request a worker refused as invalid (gRPC
// InvalidArgument): the client's mistake, so a 400 that is never migrated.
var ErrRejected = errors.New("the worker rejected the request")

// ContextLimiter is a Backend that knows how many tokens, prompt plus
// completion, the workers of a model can hold; the frontend checks requests
// against it before routing and /v1/models advertises it.
type ContextLimiter interface {
	MaxContext(model string) int // 0: unknown
}

// Model is one served model with its preprocessing.
type Model struct {
	Name    string
	Created int64
	// Encode tokenizes a plain-text prompt.
	Encode func(text string) []uint32
	// EncodeChat renders the chat template (with the generation prompt) and
	// tokenizes it.
	EncodeChat func(msgs []Message) ([]uint32, error)
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
