package sidecar

import (
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/kvbm"
)

// request is every op's payload; each op reads its own fields (the package
// doc lists them).
type request struct {
	Op string `json:"op"`

	// hello
	Role  string `json:"role,omitempty"`
	Shape string `json:"shape,omitempty"`

	// register
	BlockBytes   int `json:"block_bytes,omitempty"`
	BlockSize    int `json:"block_size,omitempty"`
	DeviceBlocks int `json:"device_blocks,omitempty"`
	// PieceBytes, the block's bytes split into pieces (each a contiguous
	// run of one KV tensor; summing to BlockBytes), asks for the
	// piece-by-piece staging layout (arena version 2); StagingAlign for
	// the staging offset's distance past a page boundary
	// (DefaultStagingAlign if absent).
	PieceBytes   []int `json:"piece_bytes,omitempty"`
	StagingAlign *int  `json:"staging_align,omitempty"`

	// match
	Req         *wireRequest `json:"req,omitempty"`
	NumComputed int          `json:"num_computed,omitempty"`

	// alloc, finished
	ID              string               `json:"id,omitempty"`
	BlockIDs        []kvbm.DeviceBlockID `json:"block_ids,omitempty"`
	NumExternal     int                  `json:"num_external,omitempty"`
	ContextPosition int                  `json:"context_position,omitempty"`

	// build
	New          []wireSched    `json:"new,omitempty"`
	Cached       []wireSched    `json:"cached,omitempty"`
	NumScheduled map[string]int `json:"num_scheduled,omitempty"`

	// bind, saved
	Iteration uint64 `json:"iteration,omitempty"`

	// stats
	Slot string `json:"slot,omitempty"`
}

// wireRequest is kvbm.Request on the wire.
type wireRequest struct {
	ID             string     `json:"id"`
	Tokens         []kv.Token `json:"tokens"`
	LoRA           string     `json:"lora,omitempty"`
	Salt           string     `json:"salt,omitempty"`
	Priority       uint32     `json:"priority,omitempty"`
	GenerationOnly bool       `json:"generation_only,omitempty"`
}

func (w *wireRequest) request() *kvbm.Request {
	if w == nil {
		return nil
	}
	return &kvbm.Request{ID: w.ID, Tokens: w.Tokens, LoRA: w.LoRA, Salt: w.Salt, Priority: w.Priority, GenerationOnly: w.GenerationOnly}
}

// wireSched is one request of a scheduler step in either engine's shape:
// vLLM's new requests give req, block_ids and num_computed, its cached ones
// id, resumed, new_token_ids, new_block_ids and num_computed; TensorRT-LLM's
// give id, new_tokens, new_block_ids and computed_position (and req for a
// request never matched).
type wireSched struct {
	ID               string               `json:"id,omitempty"`
	Req              *wireRequest         `json:"req,omitempty"`
	BlockIDs         []kvbm.DeviceBlockID `json:"block_ids,omitempty"`
	NumComputed      int                  `json:"num_computed,omitempty"`
	Resumed          bool                 `json:"resumed,omitempty"`
	NewTokenIDs      []kv.Token           `json:"new_token_ids,omitempty"`
	NewTokens        []kv.Token           `json:"new_tokens,omitempty"`
	NewBlockIDs      []kvbm.DeviceBlockID `json:"new_block_ids,omitempty"`
	ComputedPosition int                  `json:"computed_position,omitempty"`
}

// transfer is one op as the engine's worker runs it: device block
// Device[i] goes to (store) or comes from (load) staging slot Slots[i].
type transfer struct {
	Request string               `json:"req"`
	Device  []kvbm.DeviceBlockID `json:"device"`
	Slots   []int32              `json:"slots"`
}

type helloReply struct {
	Version    int    `json:"version"`
	Registered bool   `json:"registered"`
	BlockSize  int    `json:"block_size"`
	Arena      string `json:"arena,omitempty"`
}

type registerReply struct {
	Arena         string `json:"arena"`
	ArenaBytes    int    `json:"arena_bytes"`
	BlockBytes    int    `json:"block_bytes"`
	HostSlots     int    `json:"host_slots"`
	StagingOffset int    `json:"staging_offset"`
	StagingSlots  int    `json:"staging_slots"`
	// PieceBytes is the staging layout: each piece's bytes of a block,
	// staged piece by piece (arena version 2); empty: whole blocks.
	PieceBytes []int `json:"piece_bytes"`
}

type matchReply struct {
	Tokens int  `json:"tokens"`
	Async  bool `json:"async"`
}

type buildReply struct {
	Iteration uint64 `json:"iteration"`
	Loads     int    `json:"loads"`
	Stores    int    `json:"stores"`
}

type finishedReply struct {
	Delay bool `json:"delay"`
}

type bindReply struct {
	Loads      []transfer           `json:"loads"`
	Stores     []transfer           `json:"stores"`
	LoadErrors []kvbm.DeviceBlockID `json:"load_errors"`
}

type getFinishedReply struct {
	Sending []string `json:"sending"`
	Recving []string `json:"recving"`
}

type statsReply struct {
	Registered     bool          `json:"registered"`
	Stats          kvbm.Stats    `json:"stats"`
	ProtocolErrors uint64        `json:"protocol_errors"`
	StagingDropped uint64        `json:"staging_dropped"`
	Slots          int           `json:"slots"`
	Slot           *wireSlotInfo `json:"slot,omitempty"`
}

type wireSlotInfo struct {
	Phase        string               `json:"phase"`
	Tokens       int                  `json:"tokens"`
	DeviceBlocks []kvbm.DeviceBlockID `json:"device_blocks"`
	Current      int                  `json:"current"`
	Evaluated    int                  `json:"evaluated"`
	Pending      int                  `json:"pending"`
	LoadedHost   int                  `json:"loaded_host"`
	LoadedDisk   int                  `json:"loaded_disk"`
	LoadedObject int                  `json:"loaded_object"`
}
