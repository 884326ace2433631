package kv

// Hint is a router's advice to the engine a request was routed to (the
// target): Source holds a longer prefix of the prompt, and the target may
// fetch it from Source's control endpoint instead of recomputing it. It is
// advisory: an engine may ignore it, and one that consumes it must fall back
// to computing locally whenever the hint is stale or its source unreachable.
//
// Hashes name the blocks of the root-aligned prefix (the first len(Hashes)
// full blocks of the prompt) in the SOURCE engine's own hash domain, as its
// KV events reported them: only the source interprets them, since a real
// engine knows no kvmesh hash. A hint travels typed inside kvmesh and on the
// worker API; package hints lowers it to the JSON envelope for an engine
// that reads one.
type Hint struct {
	// ID is the routing decision's selection id (the envelope's message_id).
	ID string
	// Source is the worker key holding the prefix; zero when the sender did
	// not name it.
	Source WorkerKey
	// Endpoint is Source's control endpoint, tcp://host:port.
	Endpoint string
	Hashes   []EngineHash
}

// Limits of a hint, shared by every wire that carries one (the transfer
// protocol's fetch, the worker API, the JSON envelope) and by `kvmesh hints
// validate`, so a hint the tool accepts is one the wire takes.
const (
	// MaxHintBlocks bounds the block hashes of one fetch.
	MaxHintBlocks = 1 << 16
	// MaxHintIDLen bounds a hint's id (the envelope's message_id) and the
	// envelope's other names, in bytes.
	MaxHintIDLen = 256
)
