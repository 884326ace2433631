package trtllm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/kvmesh/kvmesh/engine/remote"
	"github.com/kvmesh/kvmesh/kv"
)

// TensorRT-LLM's KV events as POST /kv_cache_events answers them (its
// KVCacheEventSerializer): a list of {event_id, data, window_size,
// attention_dp_rank?}, data typed created, stored, removed or updated.

type wireEvent struct {
	EventID    *int64          `json:"event_id"`
	Data       json.RawMessage `json:"data"`
	WindowSize *int64          `json:"window_size"`
	DPRank     *int64          `json:"attention_dp_rank"`
}

type wireData struct {
	Type        string          `json:"type"`
	ParentHash  json.RawMessage `json:"parent_hash"`
	Blocks      []wireBlock     `json:"blocks"`
	BlockHashes []json.Number   `json:"block_hashes"`
	BlockHash   json.RawMessage `json:"block_hash"`
	CacheLevel  json.RawMessage `json:"cache_level"`
}

type wireBlock struct {
	BlockHash  json.Number `json:"block_hash"`
	Tokens     []wireToken `json:"tokens"`
	CacheLevel int         `json:"cache_level"`
}

type wireToken struct {
	TokenID      int64 `json:"token_id"`
	TokenExtraID int64 `json:"token_extra_id"`
}

type eventDiff struct {
	NewValue int `json:"new_value"`
	OldValue int `json:"old_value"`
}

// hash reads a block hash: TensorRT-LLM's are unsigned 64-bit; a signed
// rendering is taken as its two's complement.
func hash(n json.Number) (kv.EngineHash, error) {
	s := n.String()
	if u, err := strconv.ParseUint(s, 10, 64); err == nil {
		return kv.EngineHash(u), nil
	}
	i, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("block hash %q is not a 64-bit integer", s)
	}
	return kv.EngineHash(uint64(i)), nil
}

func rawHash(raw json.RawMessage) (kv.EngineHash, bool, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return 0, false, nil
	}
	h, err := hash(json.Number(raw))
	return h, err == nil, err
}

// tierOf maps TensorRT-LLM's cache_level: 0 is the primary (GPU) pool, 1
// the secondary (host) pool its KV offloading writes to.
func tierOf(level int) (kv.Tier, bool) {
	switch level {
	case 0:
		return kv.TierDevice, true
	case 1:
		return kv.TierHost, true
	}
	return 0, false
}

// blockInfo is what a removal or an updated event needs: the tiers a
// block is held on, and its parent and local hash to store it on another.
type blockInfo struct {
	parent    kv.EngineHash
	hasParent bool
	local     kv.LocalHash
	tiers     uint8 // bit t: held on tier t
}

// converter turns polled events into kv events: pure, no I/O; owned by the
// poller goroutine. Only rank 0 of attention DP is kept (kvmesh routes to
// the server, not to its attention-DP ranks), only the largest attention
// window (the global attention layers; sliding-window layers' blocks
// would make the index claim prefixes the model cannot reuse), and only
// full blocks (a partial block is never reused, and its removal is not
// relayed either).
type converter struct {
	blockSize int
	seed      uint64

	maxWindow int64 // the largest attention window seen
	lastID    int64
	haveID    bool
	partial   map[kv.EngineHash]bool
	blocks    map[kv.EngineHash]blockInfo

	stats remote.RelayStats
	// otherRanks counts events of attention-DP ranks other than 0.
	otherRanks uint64
	// sawAny is true once the engine returned any event at all.
	sawAny bool
}

func newConverter(blockSize int) *converter {
	return &converter{blockSize: blockSize, seed: kv.Seed("", ""), partial: make(map[kv.EngineHash]bool),
		blocks: make(map[kv.EngineHash]blockInfo)}
}

// batch converts one poll's answer. A gap in event ids (events the engine
// dropped: its buffer overflowed) or ids going backwards (the engine
// restarted) clear the worker's holdings first: TensorRT-LLM cannot replay.
func (c *converter) batch(body []byte) ([]kv.Event, error) {
	var evs []wireEvent
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&evs); err != nil {
		c.stats.Malformed++
		return nil, fmt.Errorf("kv_cache_events: %v", err)
	}
	if len(evs) == 0 {
		return nil, nil
	}
	c.sawAny = true
	c.stats.Batches++
	var out []kv.Event
	w := kv.WorkerKey{}
	for i := range evs {
		ev := &evs[i]
		if ev.DPRank != nil && *ev.DPRank != 0 {
			c.otherRanks++
			c.stats.DroppedEvents++
			continue
		}
		if ev.EventID == nil {
			c.stats.Malformed++
			continue
		}
		id := *ev.EventID
		switch {
		case c.haveID && id <= c.lastID:
			c.stats.Restarts++
			out = c.clear(out, w)
		case c.haveID && id != c.lastID+1:
			c.stats.Gaps++
			c.stats.Lost += uint64(id - c.lastID - 1)
			out = c.clear(out, w)
		}
		c.lastID, c.haveID = id, true
		c.stats.Events++
		var d wireData
		dd := json.NewDecoder(bytes.NewReader(ev.Data))
		dd.UseNumber()
		if err := dd.Decode(&d); err != nil {
			c.stats.Malformed++
			continue
		}
		// The largest window seen is the global attention's: created
		// events announce every window first, and a worker that attached
		// later learns it from the events themselves.
		if ev.WindowSize != nil && *ev.WindowSize > c.maxWindow {
			c.maxWindow = *ev.WindowSize
		}
		if d.Type == "created" {
			continue
		}
		if ev.WindowSize != nil && *ev.WindowSize < c.maxWindow {
			c.stats.DroppedEvents++
			continue
		}
		var err error
		switch d.Type {
		case "stored":
			out, err = c.stored(out, w, &d)
		case "removed":
			out, err = c.removed(out, w, &d)
		case "updated":
			out, err = c.updated(out, w, &d)
		default:
			c.stats.UnknownEvents++
		}
		if err != nil {
			c.stats.Malformed++
		}
	}
	return out, nil
}

func (c *converter) clear(out []kv.Event, w kv.WorkerKey) []kv.Event {
	c.stats.Cleared++
	clear(c.partial)
	clear(c.blocks)
	return append(out, kv.Cleared(w))
}

func (c *converter) stored(out []kv.Event, w kv.WorkerKey, d *wireData) ([]kv.Event, error) {
	parent, hasParent, err := rawHash(d.ParentHash)
	if err != nil {
		return out, err
	}
	// One kv event per run of blocks on one tier; a partial block ends
	// the chain (nothing can follow it).
	var cur *kv.Event
	for _, b := range d.Blocks {
		h, err := hash(b.BlockHash)
		if err != nil {
			return out, err
		}
		tier, ok := tierOf(b.CacheLevel)
		if !ok {
			c.stats.DroppedEvents++
			return out, nil
		}
		if len(b.Tokens) != c.blockSize {
			if len(b.Tokens) < c.blockSize {
				c.partial[h] = true
				c.stats.TruncatedStores++
			} else {
				c.stats.BlockSizeMismatches++
			}
			return out, nil
		}
		toks := make([]kv.Token, len(b.Tokens))
		for i, t := range b.Tokens {
			if t.TokenID < 0 || t.TokenID > 1<<32-1 {
				return out, fmt.Errorf("token id %d", t.TokenID)
			}
			toks[i] = kv.Token(t.TokenID)
		}
		local := kv.HashTokens(toks, c.seed)
		if cur == nil || cur.Tier != tier {
			var p *kv.EngineHash
			if hasParent {
				p = &parent
			}
			out = append(out, kv.Stored(w, tier, p, nil))
			cur = &out[len(out)-1]
		}
		cur.Blocks = append(cur.Blocks, kv.StoredBlock{EngineHash: h, LocalHash: local})
		cur.Tokens = append(cur.Tokens, toks...)
		bi := c.blocks[h]
		bi.parent, bi.hasParent, bi.local = parent, hasParent, local
		bi.tiers |= 1 << tier
		c.blocks[h] = bi
		parent, hasParent = h, true
	}
	return out, nil
}

func (c *converter) removed(out []kv.Event, w kv.WorkerKey, d *wireData) ([]kv.Event, error) {
	byTier := map[kv.Tier][]kv.EngineHash{}
	var order []kv.Tier
	for _, n := range d.BlockHashes {
		h, err := hash(n)
		if err != nil {
			return out, err
		}
		if c.partial[h] {
			delete(c.partial, h) // never relayed as stored
			continue
		}
		// TensorRT-LLM's removals name no pool: a block is in one pool at a
		// time there. A block held on several tiers (a KV block manager
		// writing through to host) leaves the fastest first.
		tier := kv.TierDevice
		if bi, ok := c.blocks[h]; ok {
			for t := kv.Tier(0); t < kv.NumTiers; t++ {
				if bi.tiers&(1<<t) != 0 {
					tier = t
					break
				}
			}
			bi.tiers &^= 1 << tier
			if bi.tiers == 0 {
				delete(c.blocks, h)
			} else {
				c.blocks[h] = bi
			}
		}
		if byTier[tier] == nil {
			order = append(order, tier)
		}
		byTier[tier] = append(byTier[tier], h)
	}
	for _, t := range order {
		out = append(out, kv.Removed(w, t, byTier[t]))
	}
	return out, nil
}

// updated relays a block's move between the primary and secondary pools
// (offload to host, onboard back) as a removal from one tier and a store
// on the other; priority changes mean nothing to routing.
func (c *converter) updated(out []kv.Event, w kv.WorkerKey, d *wireData) ([]kv.Event, error) {
	if len(bytes.TrimSpace(d.CacheLevel)) == 0 || string(bytes.TrimSpace(d.CacheLevel)) == "null" {
		return out, nil
	}
	var diff eventDiff
	if err := json.Unmarshal(d.CacheLevel, &diff); err != nil {
		return out, err
	}
	h, ok, err := rawHash(d.BlockHash)
	if err != nil || !ok {
		return out, err
	}
	bi, known := c.blocks[h]
	from, ok1 := tierOf(diff.OldValue)
	to, ok2 := tierOf(diff.NewValue)
	if !known || !ok1 || !ok2 || from == to || bi.tiers&(1<<from) == 0 {
		return out, nil
	}
	var p *kv.EngineHash
	if bi.hasParent {
		p = &bi.parent
	}
	out = append(out, kv.Removed(w, from, []kv.EngineHash{h}))
	if bi.tiers&(1<<to) == 0 {
		out = append(out, kv.Stored(w, to, p, []kv.StoredBlock{{EngineHash: h, LocalHash: bi.local}}))
	}
	bi.tiers = bi.tiers&^(1<<from) | 1<<to
	c.blocks[h] = bi
	return out, nil
}
