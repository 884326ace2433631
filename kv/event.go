package kv

import "fmt"

// WorkerKey names one engine instance and data-parallel rank; it is the unit
// the index tracks holdings for.
type WorkerKey struct {
	Instance uint64
	DPRank   uint32
}

func (w WorkerKey) String() string { return fmt.Sprintf("%x/%d", w.Instance, w.DPRank) }

// EventKind says what a KV event does.
type EventKind uint8

const (
	EventStored EventKind = iota + 1
	EventRemoved
	EventCleared
)

func (k EventKind) String() string {
	switch k {
	case EventStored:
		return "stored"
	case EventRemoved:
		return "removed"
	case EventCleared:
		return "cleared"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// StoredBlock is one block of a Stored event: the engine's opaque hash (the
// handle later removes and children refer to) and the local hash the index
// navigates by.
type StoredBlock struct {
	EngineHash EngineHash
	LocalHash  LocalHash
}

// Event is one change to a worker's cache on one tier. ID rises by one per
// event and per worker key, so a receiver can detect gaps.
type Event struct {
	ID     uint64
	Worker WorkerKey
	Tier   Tier
	Kind   EventKind

	// Stored: the chain of blocks, and the engine hash of the block before
	// the first one (HasParent false for a sequence's first block).
	HasParent bool
	Parent    EngineHash
	Blocks    []StoredBlock
	// Tokens of the stored blocks, len(Blocks)·block size, when the source
	// knows them (the vLLM wire carries them so receivers can rehash), and
	// the request identity that seeded their local hashes (kv.Seed(LoRA,
	// Salt)): a receiver that rehashes needs both.
	Tokens []Token
	LoRA   string
	Salt   string

	// Removed: engine hashes of the blocks that left this tier.
	Removed []EngineHash
}

// Stored builds a Stored event.
func Stored(w WorkerKey, tier Tier, parent *EngineHash, blocks []StoredBlock) Event {
	e := Event{Worker: w, Tier: tier, Kind: EventStored, Blocks: blocks}
	if parent != nil {
		e.HasParent, e.Parent = true, *parent
	}
	return e
}

// Removed builds a Removed event.
func Removed(w WorkerKey, tier Tier, engineHashes []EngineHash) Event {
	return Event{Worker: w, Tier: tier, Kind: EventRemoved, Removed: engineHashes}
}

// Cleared builds a Cleared event: the worker dropped everything on every tier.
func Cleared(w WorkerKey) Event {
	return Event{Worker: w, Kind: EventCleared}
}
