package mockengine

import (
	"net/http"
	"slices"

	"github.com/kvmesh/kvmesh/kv"
)

// TensorRT-LLM's KV events as its KVCacheEventSerializer writes them, in a
// bounded queue that POST /kv_cache_events drains (kv_cache_config.
// event_buffer_max_size; when full the oldest are dropped, so a slow
// poller sees a gap in event_id).

type trtEvent struct {
	EventID    int64 `json:"event_id"`
	Data       any   `json:"data"`
	WindowSize int   `json:"window_size"`
}

type trtCreated struct {
	Type                   string `json:"type"`
	NumBlocksPerCacheLevel []int  `json:"num_blocks_per_cache_level"`
}

type trtStored struct {
	Type       string           `json:"type"`
	ParentHash *uint64          `json:"parent_hash"`
	Blocks     []trtStoredBlock `json:"blocks"`
}

type trtStoredBlock struct {
	Type       string     `json:"type"`
	BlockHash  uint64     `json:"block_hash"`
	Tokens     []trtToken `json:"tokens"`
	CacheLevel int        `json:"cache_level"`
	Priority   int        `json:"priority"`
}

type trtToken struct {
	Type         string `json:"type"`
	TokenID      uint32 `json:"token_id"`
	TokenExtraID int    `json:"token_extra_id"`
}

type trtRemoved struct {
	Type        string   `json:"type"`
	BlockHashes []uint64 `json:"block_hashes"`
}

// trtDefaultPriority is TensorRT-LLM's default retention priority.
const trtDefaultPriority = 35

func (t *TRTLLM) push(data any) {
	if len(t.evBuf) >= t.cfg.EventBufferMaxSize {
		t.evBuf = append(t.evBuf[:0], t.evBuf[1:]...)
	}
	t.evBuf = append(t.evBuf, trtEvent{EventID: t.evNext, Data: data, WindowSize: t.maxLen})
	t.evNext++
}

// queueCreated queues the event an engine with events on sends first: the
// pools' sizes (primary, and secondary when a host tier is behind it).
func (t *TRTLLM) queueCreated() {
	levels := []int{t.cfg.Sim.Blocks}
	if k := t.cfg.Sim.KVBM; k != nil && k.HostBlocks > 0 {
		levels = append(levels, k.HostBlocks)
	}
	t.evMu.Lock()
	t.push(trtCreated{Type: "created", NumBlocksPerCacheLevel: levels})
	t.evMu.Unlock()
}

// sink is the sim's event sink: device blocks are cache level 0, the KV
// block manager's host tier level 1 (TensorRT-LLM's secondary pool); its
// disk tier has no level in TensorRT-LLM's events and is not reported.
func (t *TRTLLM) sink(evs []kv.Event) {
	t.evMu.Lock()
	defer t.evMu.Unlock()
	bs := t.cfg.Sim.BlockSize
	kvbm := t.cfg.Sim.KVBM != nil
	for _, e := range evs {
		level := 0
		switch e.Tier {
		case kv.TierDevice:
		case kv.TierHost:
			level = 1
		default:
			continue
		}
		switch e.Kind {
		case kv.EventStored:
			d := trtStored{Type: "stored", Blocks: make([]trtStoredBlock, 0, len(e.Blocks))}
			if e.HasParent {
				p := uint64(EngineHash(kv.SeqHash(e.Parent)))
				d.ParentHash = &p
			}
			for i, b := range e.Blocks {
				seq := kv.SeqHash(b.EngineHash)
				sb := trtStoredBlock{Type: "stored_block", BlockHash: uint64(EngineHash(seq)),
					CacheLevel: level, Priority: trtDefaultPriority}
				var toks []kv.Token
				if len(e.Tokens) >= (i+1)*bs {
					toks = e.Tokens[i*bs : (i+1)*bs]
					if kvbm {
						// The block manager's host stores name no tokens; the
						// device store before them did.
						t.blockTokens[seq] = slices.Clone(toks)
					}
				} else {
					toks = t.blockTokens[seq]
				}
				sb.Tokens = make([]trtToken, len(toks))
				for j, tok := range toks {
					sb.Tokens[j] = trtToken{Type: "unique_token", TokenID: tok}
				}
				d.Blocks = append(d.Blocks, sb)
			}
			t.push(d)
		case kv.EventRemoved:
			d := trtRemoved{Type: "removed", BlockHashes: make([]uint64, len(e.Removed))}
			for i, h := range e.Removed {
				d.BlockHashes[i] = uint64(EngineHash(kv.SeqHash(h)))
				if level == 1 {
					delete(t.blockTokens, kv.SeqHash(h))
				}
			}
			t.push(d)
		}
	}
}

// serveEvents drains the queue: [] when event_buffer_max_size is 0.
func (t *TRTLLM) serveEvents(w http.ResponseWriter, _ *http.Request) {
	t.evMu.Lock()
	out := t.evBuf
	t.evBuf = nil
	t.evMu.Unlock()
	if out == nil {
		out = []trtEvent{}
	}
	writeJSON(w, http.StatusOK, out)
}
