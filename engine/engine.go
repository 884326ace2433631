// Package engine defines the Engine every worker drives: the simulated engine
// in engine/sim and adapters to real engines implement it.
//
// It imports only kv: the sim and the real-engine adapters implement it, and
// the worker drives it; it must not import either.
package engine

import (
	"context"
	"errors"

	"github.com/kvmesh/kvmesh/kv"
)

// Config is an engine's static description; workers register it.
type Config struct {
	Model            string
	Role             kv.Role
	BlockSize        int // tokens per KV block
	Blocks           int // device KV capacity in blocks
	MaxBatchedTokens int // token budget per scheduler step
	MaxSeqs          int // running sequences per step
	// MaxModelLen is the longest prompt plus completion the engine accepts
	// (a real engine's context length); 0: only its KV capacity bounds it.
	MaxModelLen int
	// Digest names the KV layout (block size, layers, KV heads, head dim,
	// dtype, TP); only workers with equal digests can share blocks.
	Digest string
}

// Request is one generation.
type Request struct {
	ID     string
	Tokens []kv.Token // the prompt
	kv.Sampling
	LoRA      string // adapter name; mixed into block hashes
	CacheSalt string // cache namespace; mixed into block hashes
	// KVHint is the router's KV hint, validated where it entered the
	// worker, or nil. It is advisory (see kv.Hint): an engine may ignore
	// it, and one that consumes it must fall back to computing locally
	// whenever it is stale or its source unreachable. An adapter to an
	// engine that reads JSON lowers it with package hints.
	KVHint *kv.Hint
	// DPRank is the data-parallel rank to run on (see Ranked); 0 on an
	// engine with one rank.
	DPRank int
	// Leg is the request's part in disaggregated serving. A LegPrefill
	// request computes the prompt, keeps its KV for the decode side and
	// returns connector parameters on its last chunk; a LegDecode request
	// carries those parameters in TransferParams, whole and unchanged, and
	// never a KVHint.
	Leg kv.Leg
	// TransferParams are the engine's own connector parameters (opaque
	// JSON, produced by the prefill engine's LegPrefill answer).
	TransferParams []byte
}

// Usage counts one generation's tokens.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	CachedTokens     int // prompt tokens served from the prefix cache (any tier or peer)
	// Of CachedTokens, those onboarded from a KV block manager's host,
	// disk and object tiers (the rest were on the device or came from a
	// peer: PeerCachedTokens).
	HostCachedTokens, DiskCachedTokens int
	ObjectCachedTokens                 int
	// Of CachedTokens, those fetched from another worker: a KV hint's
	// prefix or a decode leg's handoff.
	PeerCachedTokens int
}

// ByTier splits CachedTokens by where they came from, its total always
// CachedTokens: the peer, host, disk and object shares in that order, each
// cut to what is left of it (an engine's inconsistent counts never inflate
// the total), and the device share the rest. An object tier counts as
// external.
func (u *Usage) ByTier() kv.CachedByTier {
	var c kv.CachedByTier
	left := max(u.CachedTokens, 0)
	for _, s := range [...]struct{ i, n int }{{kv.PeerCached, u.PeerCachedTokens}, {int(kv.TierHost), u.HostCachedTokens},
		{int(kv.TierDisk), u.DiskCachedTokens}, {int(kv.TierExternal), u.ObjectCachedTokens}} {
		c[s.i] = min(max(s.n, 0), left)
		left -= c[s.i]
	}
	c[kv.TierDevice] = left
	return c
}

// Chunk is one piece of a generation's output stream. The last chunk has a
// non-empty Finish (and Usage); an Err ends the stream with FinishError.
type Chunk struct {
	Tokens []kv.Token
	Finish kv.FinishReason
	Usage  *Usage
	Err    error
	// TransferParams, on the last chunk of a LegPrefill request whose
	// output is not final, are the connector parameters the decode leg
	// must carry.
	TransferParams []byte
}

// Stats is an engine's load at one instant.
type Stats struct {
	Running              int
	Waiting              int
	UsedBlocks           int
	TotalBlocks          int
	PendingPrefillTokens int
}

// EventSink receives the engine's KV events in order, one batch per call.
// It must not block for long: the engine calls it on its scheduling path.
type EventSink func(batch []kv.Event)

// Engine is what a worker drives.
type Engine interface {
	Config() Config
	// Generate starts a request. The stream ends with a chunk whose Finish is
	// set, then closes. Cancelling ctx stops the engine's work on it.
	Generate(ctx context.Context, req *Request) (<-chan Chunk, error)
	Stats() Stats
	// SetEventSink installs where KV events go; nil drops them.
	SetEventSink(EventSink)
	Close() error
}

// Ranked is implemented by an engine that runs several data-parallel ranks
// behind one instance, as vLLM's DP engines do: each rank has its own KV
// cache, scheduler and event stream (its events carry the rank in
// kv.Event.Worker.DPRank). Generate runs a request on Request.DPRank and
// Stats sums over the ranks; RankStats is one rank's load, which the
// worker reports per rank so routers see each rank's own load.
type Ranked interface {
	DPSize() int
	RankStats(rank int) Stats
}

// Health is implemented by an engine whose server can stop answering while
// the worker lives (a real engine behind HTTP, polled on its /health). The
// worker takes itself out of service while it is unhealthy (it leaves
// discovery and fails its streams Unavailable, so callers migrate them)
// and returns when it is healthy again.
type Health interface {
	// Health is the latest verdict and a channel closed at the next change
	// of it (and at Close).
	Health() (healthy bool, changed <-chan struct{})
}

// Inventory is implemented by an engine that can list the KV blocks it
// holds, as the sim does from its block table and a remote adapter from
// its relayed KV events; the worker answers dump queries (the event
// plane's gap repair) from it. Without it a worker has
// no dumps to give, and a router repairing a gap too old for the event ring
// clears that worker's holdings and relearns them from later events.
type Inventory interface {
	// Inventory lists what DP rank rank holds, per tier, as Stored events
	// (ID 0) that rebuild its holdings when applied in order to an empty
	// index. at, if non-nil, is called once while the list is exact with
	// respect to the rank's event stream: every batch delivered to the
	// event sink before at is reflected, none delivered after. It reports
	// false for a rank the engine does not have.
	Inventory(rank int, at func()) ([]kv.Event, bool)
}

// ErrClosed is returned by Generate after Close.
var ErrClosed = errors.New("engine closed")

// ErrUnavailable marks (errors.Is) a failure of the engine itself rather
// than of the request: a refused connection, a 5xx, a stream cut short. A
// Generate error or a Chunk.Err wrapping it makes the worker answer
// Unavailable, so the request migrates to another worker; any other error
// is the request's own and reaches the client as a 4xx.
var ErrUnavailable = errors.New("engine unavailable")
