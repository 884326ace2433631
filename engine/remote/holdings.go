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
type rankHoldings struct {
	blocks map[tierHash]heldBlock
	next   uint64
}

func newRankHoldings() *rankHoldings {
	return &rankHoldings{blocks: map[tierHash]heldBlock{}}
}

// apply updates the holdings with relayed events.
func (h *rankHoldings) apply(evs []kv.Event) {
	for i := range evs {
		e := &evs[i]
		switch e.Kind {
		case kv.EventStored:
			parent, hasParent := e.Parent, e.HasParent
			for _, b := range e.Blocks {
				k := tierHash{e.Tier, b.EngineHash}
				if _, ok := h.blocks[k]; !ok {
					h.next++
					h.blocks[k] = heldBlock{order: h.next, hasParent: hasParent, parent: parent, local: b.LocalHash, lora: e.LoRA, salt: e.Salt}
				}
				parent, hasParent = b.EngineHash, true
			}
		case kv.EventRemoved:
			for _, hash := range e.Removed {
				delete(h.blocks, tierHash{e.Tier, hash})
			}
		case kv.EventCleared:
			clear(h.blocks)
		}
	}
}

// list returns the holdings as Stored events for w, one block each, every
// parent the rank still holds listed before its children, so that applied
// in order to an empty index they rebuild what the events built.
func (h *rankHoldings) list(w kv.WorkerKey) []kv.Event {
	keys := make([]tierHash, 0, len(h.blocks))
	for k := range h.blocks {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b tierHash) int {
		oa, ob := h.blocks[a].order, h.blocks[b].order
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
		b := h.blocks[k]
		if p := (tierHash{k.tier, b.parent}); b.hasParent {
			if _, held := h.blocks[p]; held {
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
