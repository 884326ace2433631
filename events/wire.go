package events

import (
	"fmt"

	"github.com/kvmesh/kvmesh/kv"
)

// EventType is the tag of one wire event.
type EventType uint8

const (
	TypeStored EventType = iota + 1
	TypeRemoved
	TypeCleared
)

// Wire tags, as vLLM's msgspec tagged structs name them.
const (
	TagStored  = "BlockStored"
	TagRemoved = "BlockRemoved"
	TagCleared = "AllBlocksCleared"
)

// Tag is the wire tag of t.
func (t EventType) Tag() string {
	switch t {
	case TypeStored:
		return TagStored
	case TypeRemoved:
		return TagRemoved
	case TypeCleared:
		return TagCleared
	}
	return fmt.Sprintf("EventType(%d)", uint8(t))
}

// String is the short name used in logs and by `kvmesh events listen`.
func (t EventType) String() string {
	switch t {
	case TypeStored:
		return "stored"
	case TypeRemoved:
		return "removed"
	case TypeCleared:
		return "cleared"
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Event is one decoded wire event. Optional wire fields carry a Has flag so
// nil and absent stay distinguishable from zero.
type Event struct {
	Type EventType

	// BlockStored and BlockRemoved.
	BlockHashes []kv.EngineHash // bit-cast to u64 whatever their wire type
	Medium      string
	HasMedium   bool

	// BlockStored only.
	Parent      kv.EngineHash
	HasParent   bool
	TokenIDs    []uint32
	BlockSize   int
	LoRAID      int64 // deprecated by vLLM; carried, never used for hashing
	HasLoRAID   bool
	LoRAName    string
	HasLoRAName bool
	// CacheSalt is the request's cache salt: a map event's cache_salt key,
	// else vLLM's form, the last string of the first block's extra_keys
	// tuple in a store without a parent (see saltFromExtraKeys). The
	// encoder writes the vLLM form. Locality only arrives in map events.
	CacheSalt string
	Locality  string
}

// Batch is one decoded EventBatch: one sequence number on the wire.
type Batch struct {
	TS        float64
	Events    []Event
	DPRank    int64
	HasDPRank bool
}

// Shape says how the encoder lays out a batch.
type Shape uint8

const (
	// ShapeArray: positional batch and positional events (vLLM's classic
	// msgspec array_like layout).
	ShapeArray Shape = iota
	// ShapeMapEvents: positional batch, events as maps tagged by "type"
	// (vLLM after PR #42892, SGLang).
	ShapeMapEvents
	// ShapeMap: batch and events both maps.
	ShapeMap
	// ShapeSGLang: SGLang's publisher (python/sglang/srt/disaggregation/
	// kv_events.py): a positional batch [ts, events] without the DP rank
	// (older builds; each rank publishes on its own port), positional
	// events with SGLang's fields only (BlockStored [tag, block_hashes,
	// parent_block_hash, token_ids, block_size, lora_id]), and block hashes
	// written as SIGNED integers: SGLang's are the first 8 bytes of a
	// SHA-256 read as an int64, so half of them are negative.
	ShapeSGLang
)

func (s Shape) String() string {
	switch s {
	case ShapeArray:
		return "array"
	case ShapeMapEvents:
		return "map-events"
	case ShapeMap:
		return "map"
	case ShapeSGLang:
		return "sglang"
	}
	return fmt.Sprintf("shape(%d)", uint8(s))
}

// ParseShape accepts the names String prints.
func ParseShape(s string) (Shape, error) {
	for _, v := range []Shape{ShapeArray, ShapeMapEvents, ShapeMap, ShapeSGLang} {
		if v.String() == s {
			return v, nil
		}
	}
	return 0, fmt.Errorf("unknown event shape %q (want array, map-events or map)", s)
}

// Field names of map-shaped batches and events (msgspec uses the Python
// attribute names).
const (
	keyTS        = "ts"
	keyEvents    = "events"
	keyDPRank    = "data_parallel_rank"
	keyType      = "type"
	keyHashes    = "block_hashes"
	keyParent    = "parent_block_hash"
	keyTokens    = "token_ids"
	keyBlockSize = "block_size"
	keyLoRAID    = "lora_id"
	keyMedium    = "medium"
	keyLoRAName  = "lora_name"
	keyExtraKeys = "extra_keys"
	keyCacheSalt = "cache_salt"
	keyLocality  = "locality"
)
