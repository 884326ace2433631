package kv

import (
	"errors"
	"fmt"
	"time"
)

// The request plane's vocabulary: what the HTTP frontend hands the live
// backend (fleet) and what comes back. Both speak it; neither imports the
// other.

// GenerateRequest is a preprocessed (tokenized) request: its identity,
// tokens and sampling. It has no field for client routing hints, so none
// can reach a worker.
type GenerateRequest struct {
	RequestID string
	Model     string
	// LoRA (adapter name) and CacheSalt are the request's cache identity:
	// both seed its block hashes (Seed), so a request shares cached blocks
	// only with requests of the same adapter and salt — on every worker, in
	// the router's index, in hints and in peer transfers. "" is none.
	LoRA      string
	CacheSalt string
	Tokens    []uint32
	Sampling
	// Attempt counts migrations: 0 for the first try.
	Attempt int
	// Hashes, when set, carry block hashes known for Tokens' first blocks
	// (their Known) and take the ones routing computes (Keep), for later
	// prompts that start with these tokens. In process only: the sender
	// vouches that Tokens start with the tokens Known was made for.
	Hashes *PromptHashes
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
	Finish       FinishReason
	PromptTokens int
	CachedTokens int
	// CachedByTier splits CachedTokens (set with them, on the last chunk).
	CachedByTier CachedByTier
}

// CachedByTier splits a generation's cached prompt tokens by where the
// worker found them: its own tiers, indexed by Tier (a block manager's
// object store counts as external), then PeerCached, blocks fetched from
// another worker (a KV hint's prefix, a decode leg's handoff).
type CachedByTier [NumTiers + 1]int

// PeerCached indexes the peer share of a CachedByTier.
const PeerCached = NumTiers

// CachedSourceName names index i of a CachedByTier: a tier's name, or
// "peer".
func CachedSourceName(i int) string {
	if i == PeerCached {
		return "peer"
	}
	return Tier(i).String()
}

// Total is the cached tokens of every source.
func (c CachedByTier) Total() int {
	n := 0
	for _, v := range c {
		n += v
	}
	return n
}

// ErrWorkerLost marks a failure of the worker (not of the request): the
// request may be migrated to another worker.
var ErrWorkerLost = errors.New("worker lost")

// ErrRejected marks a request a worker refused as invalid: the client's
// mistake, never migrated.
var ErrRejected = errors.New("the worker rejected the request")

// ErrCredentials marks a worker that refused this frontend's fleet
// credentials (TLS, fleet token): a configuration error, not a failure of
// the worker, so it is never migrated and the worker is not inhibited.
var ErrCredentials = errors.New("fleet credentials refused")

// ErrNoWorkers means no (eligible) worker serves the request's model and
// role right now.
var ErrNoWorkers = errors.New("no workers")

// ErrAllBusy is matched (errors.Is) by a *BusyError: every candidate worker
// is past a busy threshold.
var ErrAllBusy = errors.New("all workers are busy")

// BusyError says every candidate was busy and when to retry.
type BusyError struct {
	Model      string
	Workers    int
	RetryAfter time.Duration
}

func (e *BusyError) Error() string {
	return fmt.Sprintf("all %d workers of model %q are busy, retry after %v", e.Workers, e.Model, e.RetryAfter)
}

func (e *BusyError) Unwrap() error { return ErrAllBusy }

// ErrQueueFull is matched (errors.Is) by a *QueueFullError.
var ErrQueueFull = errors.New("router queue is full")

// QueueFullError says the router's queue of requests waiting for a worker
// is at its limit (a 429) and when to retry.
type QueueFullError struct {
	Model      string
	Limit      int
	RetryAfter time.Duration
}

func (e *QueueFullError) Error() string {
	return fmt.Sprintf("the router queue for model %q is full (%d waiting), retry after %v", e.Model, e.Limit, e.RetryAfter)
}

func (e *QueueFullError) Unwrap() error { return ErrQueueFull }
