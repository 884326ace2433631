package kv

import (
	"errors"
	"fmt"
	"time"
)

// The request plane's vocabulary: what the HTTP frontend hands the live
// backend (fleet) and what comes back. Both speak it; neither imports the
// other.

// GenerateRequest is a preprocessed (tokenized) request: tokens and
// sampling only. It has no field for client routing hints, so none can
// reach a worker.
type GenerateRequest struct {
	RequestID   string
	Model       string
	Tokens      []uint32
	MaxTokens   int
	StopTokens  []uint32
	Seed        uint64
	Temperature float64
	TopP        float64 // 0: not set (the engine's default, 1)
	// PresencePenalty and FrequencyPenalty: 0 applies none.
	PresencePenalty  float64
	FrequencyPenalty float64
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

// TokenChunk is a piece of output. The final chunk sets Finish ("stop" or
// "length") and the usage fields.
type TokenChunk struct {
	Tokens       []uint32
	Finish       string
	PromptTokens int
	CachedTokens int
}

// ErrWorkerLost marks a failure of the worker (not of the request): the
// request may be migrated to another worker.
var ErrWorkerLost = errors.New("worker lost")

// ErrRejected marks a request a worker refused as invalid: the client's
// mistake, never migrated.
var ErrRejected = errors.New("the worker rejected the request")

// ErrNoWorkers: no worker serves the model right now.
var ErrNoWorkers = errors.New("no worker available")

// BusyError: every worker is over its busy threshold.
type BusyError struct{ RetryAfter time.Duration }

func (e *BusyError) Error() string {
	return fmt.Sprintf("all workers are busy; retry after %s", e.RetryAfter)
}
