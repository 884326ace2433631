package remote

import (
	"slices"

	"github.com/kvmesh/kvmesh/kv"
)

// heldBlock is one block a rank holds on one tier, as its Stored event
// described it.
type heldBlock struct {
	order     uint64 // when it was stored: parents come before children
	hasParent bool
	parent    kv.EngineHash
	local     kv.LocalHash
	lora      string
	salt      string
}

type tierHash struct {
	tier kv.Tier
	hash kv.EngineHash
}

// rankHoldings is what one rank holds according to the events relayed
// from it: a remote engine cannot list its cache, so the relay keeps the
// list its own events built, to answer the worker's dumps (without it, a
// router that dumps a new or gapped worker learns nothing of what the
// engine already holds).
//
// One map per tier, keyed by the hash alone: every block a prompt stores
// and every one evicted passes through here, and a map of integer keys
// takes the runtime's fast path where a struct key is hashed generically.
type rankHoldings struct {
	tiers map[kv.Tier]map[kv.EngineHash]heldBlock
	next  uint64
}

func newRankHoldings() *rankHoldings {
	return &rankHoldings{tiers: map[kv.Tier]map[kv.EngineHash]heldBlock{}}
}

// tier is t's map, made on first use.
func (h *rankHoldings) tier(t kv.Tier) map[kv.EngineHash]heldBlock {
	m := h.tiers[t]
	if m == nil {
		m = map[kv.EngineHash]heldBlock{}
		h.tiers[t] = m
	}
	return m
}

// apply updates the holdings with relayed events.
func (h *rankHoldings) apply(evs []kv.Event) {
	for i := range evs {
		e := &evs[i]
		switch e.Kind {
		case kv.EventStored:
			m := h.tier(e.Tier)
			parent, hasParent := e.Parent, e.HasParent
			for _, b := range e.Blocks {
				if _, ok := m[b.EngineHash]; !ok {
					h.next++
					m[b.EngineHash] = heldBlock{order: h.next, hasParent: hasParent, parent: parent, local: b.LocalHash, lora: e.LoRA, salt: e.Salt}
				}
				parent, hasParent = b.EngineHash, true
			}
		case kv.EventRemoved:
			if m := h.tiers[e.Tier]; m != nil {
				for _, hash := range e.Removed {
					delete(m, hash)
				}
			}
		case kv.EventCleared:
			clear(h.tiers)
		}
	}
}

// list returns the holdings as Stored events for w, one block each, every
// parent the rank still holds listed before its children, so that applied
// in order to an empty index they rebuild what the events built.
func (h *rankHoldings) list(w kv.WorkerKey) []kv.Event {
	n := 0
	for _, m := range h.tiers {
		n += len(m)
	}
	keys := make([]tierHash, 0, n)
	for t, m := range h.tiers {
		for hash := range m {
			keys = append(keys, tierHash{t, hash})
		}
	}
	slices.SortFunc(keys, func(a, b tierHash) int {
		oa, ob := h.tiers[a.tier][a.hash].order, h.tiers[b.tier][b.hash].order
		switch {
		case oa < ob:
			return -1
		case oa > ob:
			return 1
		}
		return 0
	})
	evs := make([]kv.Event, 0, len(keys))
	listed := make(map[tierHash]bool, len(keys))
	var emit func(k tierHash)
	emit = func(k tierHash) {
		if listed[k] {
			return
		}
		listed[k] = true
		b := h.tiers[k.tier][k.hash]
		if p := (tierHash{k.tier, b.parent}); b.hasParent {
			if _, held := h.tiers[k.tier][b.parent]; held {
				emit(p) // re-stored after its child: list it first
			}
		}
		e := kv.Stored(w, k.tier, nil, []kv.StoredBlock{{EngineHash: k.hash, LocalHash: b.local}})
		e.HasParent, e.Parent, e.LoRA, e.Salt = b.hasParent, b.parent, b.lora, b.salt
		evs = append(evs, e)
	}
	for _, k := range keys {
		emit(k)
	}
	return evs
}
