package events

import (
	"strings"

	"github.com/kvmesh/kvmesh/kv"
)

// Medium names the publisher writes for each tier (vLLM says "GPU"/"CPU").
var tierMedium = [kv.NumTiers]string{"GPU", "CPU", "DISK", "EXTERNAL"}

// MediumOf is the wire medium for a tier.
func MediumOf(t kv.Tier) string {
	if t.Valid() {
		return tierMedium[t]
	}
	return "GPU"
}

// ToWire converts kv events into wire batches, one batch per run of
// consecutive events with the same DP rank. blockSize is written as
// block_size; 0 derives it from each event's tokens and blocks.
func ToWire(evs []kv.Event, blockSize int, ts float64) []Batch {
	var out []Batch
	for i := range evs {
		e := &evs[i]
		if len(out) == 0 || out[len(out)-1].DPRank != int64(e.Worker.DPRank) {
			out = append(out, Batch{TS: ts, DPRank: int64(e.Worker.DPRank), HasDPRank: true})
		}
		b := &out[len(out)-1]
		switch e.Kind {
		case kv.EventStored:
			w := Event{Type: TypeStored, Parent: e.Parent, HasParent: e.HasParent, BlockSize: blockSize,
				Medium: MediumOf(e.Tier), HasMedium: true, LoRAName: e.LoRA, HasLoRAName: e.LoRA != "", CacheSalt: e.Salt}
			w.BlockHashes = make([]kv.EngineHash, len(e.Blocks))
			for j, blk := range e.Blocks {
				w.BlockHashes[j] = blk.EngineHash
			}
			w.TokenIDs = e.Tokens
			if w.BlockSize == 0 && len(e.Blocks) > 0 {
				w.BlockSize = len(e.Tokens) / len(e.Blocks)
			}
			b.Events = append(b.Events, w)
		case kv.EventRemoved:
			b.Events = append(b.Events, Event{Type: TypeRemoved, BlockHashes: e.Removed,
				Medium: MediumOf(e.Tier), HasMedium: true})
		case kv.EventCleared:
			b.Events = append(b.Events, Event{Type: TypeCleared})
		}
	}
	return out
}

// ConvertStats counts what conversion dropped or cut.
type ConvertStats struct {
	Dropped   uint64 // events that yielded nothing (unknown medium, remote, no full block, duplicate hashes)
	Truncated uint64 // stores cut at a short or mismatched block
	// UnknownMedia counts events dropped for a medium no tier answers to
	// (also counted in Dropped).
	UnknownMedia uint64
	// SaltUntracked counts salted blocks not remembered because MaxSalted
	// were held: a store continuing from one is hashed unsalted.
	SaltUntracked uint64
}

// MaxSalted bounds how many salted blocks a Converter remembers.
const MaxSalted = 1 << 20

// Converter turns decoded wire batches into kv events for one engine
// instance. It recomputes each block's local hash from token_ids (with the
// LoRA name and cache salt mixed in by kv.Seed), keeps the engine hash as
// the handle, and numbers events per worker key. vLLM names the salt only
// on a request's first block, so the Converter remembers the salt of every
// salted block it has seen stored (until removed or cleared) and gives it
// to stores that continue from one. Not safe for concurrent use.
type Converter struct {
	Instance uint64
	// BlockSize is the worker's configured block size; 0 trusts the wire.
	BlockSize int
	// DPRank is used when a batch carries none.
	DPRank uint32

	ids    map[kv.WorkerKey]uint64
	salted map[saltKey]string
	Stats  ConvertStats
}

// saltKey names one block copy: the same engine hash can sit on several
// tiers and leave them one at a time.
type saltKey struct {
	w    kv.WorkerKey
	tier kv.Tier
	hash kv.EngineHash
}

// Worker is the worker key a batch's events belong to.
func (c *Converter) Worker(b *Batch) kv.WorkerKey {
	w := kv.WorkerKey{Instance: c.Instance, DPRank: c.DPRank}
	if b != nil && b.HasDPRank {
		w.DPRank = uint32(b.DPRank)
	}
	return w
}

// NextID returns the next event ID for w: 1, 2, 3, … per worker key.
func (c *Converter) NextID(w kv.WorkerKey) uint64 {
	if c.ids == nil {
		c.ids = make(map[kv.WorkerKey]uint64)
	}
	c.ids[w]++
	return c.ids[w]
}

// Convert appends the kv events of b to dst.
func (c *Converter) Convert(dst []kv.Event, b *Batch) []kv.Event {
	w := c.Worker(b)
	for i := range b.Events {
		ev := &b.Events[i]
		var out kv.Event
		switch ev.Type {
		case TypeCleared:
			out = kv.Cleared(w)
			c.forgetWorker(w)
		case TypeRemoved:
			tier, ok := c.tier(ev)
			if !ok || len(ev.BlockHashes) == 0 {
				c.Stats.Dropped++
				continue
			}
			out = kv.Removed(w, tier, ev.BlockHashes)
			if len(c.salted) > 0 {
				for _, h := range ev.BlockHashes {
					delete(c.salted, saltKey{w, tier, h})
				}
			}
		case TypeStored:
			var ok bool
			if out, ok = c.stored(w, ev); !ok {
				c.Stats.Dropped++
				continue
			}
		default:
			continue
		}
		out.ID = c.NextID(w)
		dst = append(dst, out)
	}
	return dst
}

func (c *Converter) tier(ev *Event) (kv.Tier, bool) {
	// Blocks on a remote filesystem or object store are not this worker's.
	if strings.EqualFold(ev.Locality, "REMOTE") {
		return 0, false
	}
	t, ok := kv.TierFromMedium(ev.Medium)
	if !ok {
		c.Stats.UnknownMedia++
	}
	return t, ok
}

func (c *Converter) stored(w kv.WorkerKey, ev *Event) (kv.Event, bool) {
	tier, ok := c.tier(ev)
	if !ok {
		return kv.Event{}, false
	}
	bs := c.BlockSize
	if bs == 0 {
		bs = ev.BlockSize
	}
	if bs <= 0 {
		return kv.Event{}, false
	}
	// A store that names a hash twice (parent included) cannot be a chain.
	seen := make(map[kv.EngineHash]struct{}, len(ev.BlockHashes)+1)
	if ev.HasParent {
		seen[ev.Parent] = struct{}{}
	}
	for _, h := range ev.BlockHashes {
		if _, dup := seen[h]; dup {
			return kv.Event{}, false
		}
		seen[h] = struct{}{}
	}
	// Cut blocks at the wire's block size; stop at the first block whose
	// size differs from ours or whose tokens run short.
	n := 0
	if ev.BlockSize == 0 || ev.BlockSize == bs {
		n = min(len(ev.BlockHashes), len(ev.TokenIDs)/bs)
	}
	if n < len(ev.BlockHashes) {
		c.Stats.Truncated++
	}
	if n == 0 {
		return kv.Event{}, false
	}
	salt := ev.CacheSalt
	if salt == "" && ev.HasParent {
		salt = c.parentSalt(w, tier, ev.Parent)
	}
	seed := kv.Seed(ev.LoRAName, salt)
	blocks := make([]kv.StoredBlock, n)
	for i := range blocks {
		blocks[i] = kv.StoredBlock{EngineHash: ev.BlockHashes[i], LocalHash: kv.HashTokens(ev.TokenIDs[i*bs:(i+1)*bs], seed)}
	}
	var parent *kv.EngineHash
	if ev.HasParent {
		parent = &ev.Parent
	}
	out := kv.Stored(w, tier, parent, blocks)
	out.Tokens = ev.TokenIDs[:n*bs]
	out.LoRA, out.Salt = ev.LoRAName, salt
	if salt != "" {
		c.remember(w, tier, blocks, salt)
	}
	return out, true
}

// parentSalt is the salt of the parent block, looked up on the store's
// tier first (an offload may store a child on another tier than its parent).
func (c *Converter) parentSalt(w kv.WorkerKey, tier kv.Tier, parent kv.EngineHash) string {
	if len(c.salted) == 0 {
		return ""
	}
	if s, ok := c.salted[saltKey{w, tier, parent}]; ok {
		return s
	}
	for t := range kv.Tier(kv.NumTiers) {
		if s, ok := c.salted[saltKey{w, t, parent}]; ok {
			return s
		}
	}
	return ""
}

func (c *Converter) remember(w kv.WorkerKey, tier kv.Tier, blocks []kv.StoredBlock, salt string) {
	if c.salted == nil {
		c.salted = make(map[saltKey]string)
	}
	for _, b := range blocks {
		if len(c.salted) >= MaxSalted {
			c.Stats.SaltUntracked++
			continue
		}
		c.salted[saltKey{w, tier, b.EngineHash}] = salt
	}
}

func (c *Converter) forgetWorker(w kv.WorkerKey) {
	for k := range c.salted {
		if k.w == w {
			delete(c.salted, k)
		}
	}
}
