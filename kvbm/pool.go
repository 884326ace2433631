package kvbm

import (
	"slices"

	"github.com/kvmesh/kvmesh/internal/u64map"
	"github.com/kvmesh/kvmesh/kv"
)

type slotState uint8

const (
	slotFree       slotState = iota // in the free list, holds no block
	slotWriting                     // allocated, its bytes being written
	slotRegistered                  // holds a findable block
	slotDropped                     // unregistered while pinned: freed on the last release
)

type poolSlot struct {
	meta       BlockMeta
	state      slotState
	ref        int32  // pins: requests onboarding it, or its writer
	returned   uint64 // tick of the last release to zero pins
	prev, next int32  // inactive list links
	listed     bool
}

// lru is one priority's inactive blocks, least recently returned first.
type lru struct{ head, tail int32 }

// pool is one tier's slots: registry (hash → slot), the free list and the
// inactive (evictable) set ordered by (priority, returned tick).
type pool struct {
	tier   kv.Tier
	store  Storage
	slots  []poolSlot
	byHash u64map.Map[kv.SeqHash, int32]
	free   []int32
	lists  map[uint32]*lru
	prios  []uint32 // priorities with a non-empty list, ascending
	tick   uint64
	ev     *eventLog
	// onEvict sees a block about to be evicted, its bytes still intact.
	onEvict func(p *pool, s int32)

	evicted, dropped uint64
}

func newPool(tier kv.Tier, store Storage, ev *eventLog) *pool {
	n := store.Slots()
	p := &pool{tier: tier, store: store, slots: make([]poolSlot, n),
		byHash: u64map.New[kv.SeqHash, int32](n), free: make([]int32, n),
		lists: map[uint32]*lru{}, ev: ev}
	for i := range p.free {
		p.free[i] = int32(n - 1 - i) // pop from the end: slot 0 first
	}
	return p
}

func (p *pool) lookup(h kv.SeqHash) (int32, bool) {
	s, ok := p.byHash.Get(h)
	return s, ok
}

func (p *pool) len() int { return p.byHash.Len() }

// acquire pins a registered slot, taking it off the inactive set.
func (p *pool) acquire(s int32) {
	sl := &p.slots[s]
	if sl.ref == 0 && sl.listed {
		p.unlist(s)
	}
	sl.ref++
}

// release drops one pin; the last one makes a registered slot evictable
// and frees a dropped one.
func (p *pool) release(s int32) {
	sl := &p.slots[s]
	sl.ref--
	if sl.ref > 0 {
		return
	}
	switch sl.state {
	case slotRegistered:
		p.tick++
		sl.returned = p.tick
		p.list(s)
	case slotDropped, slotWriting:
		sl.state = slotFree
		p.free = append(p.free, s)
	}
}

// alloc takes a free slot, else evicts the lowest-priority, least recently
// returned inactive block. The slot comes back pinned by the caller, in
// state slotWriting; ok is false when every slot is pinned.
func (p *pool) alloc() (int32, bool) {
	var s int32
	if n := len(p.free); n > 0 {
		s = p.free[n-1]
		p.free = p.free[:n-1]
	} else {
		if len(p.prios) == 0 {
			return 0, false
		}
		s = p.lists[p.prios[0]].head
		p.unlist(s)
		if p.onEvict != nil {
			// Pinned while it is copied: the hook may allocate in
			// another tier, never this one.
			p.slots[s].ref++
			p.onEvict(p, s)
			p.slots[s].ref--
		}
		p.unregister(s)
		p.evicted++
	}
	sl := &p.slots[s]
	sl.state, sl.ref, sl.meta = slotWriting, 1, BlockMeta{}
	return s, true
}

// register makes a written slot findable (Stored event) and releases the
// writer's pin. It reports false, freeing the slot, if the hash is already
// registered here.
func (p *pool) register(s int32, m BlockMeta) bool {
	if _, dup := p.byHash.Get(m.Seq); dup {
		p.release(s)
		return false
	}
	sl := &p.slots[s]
	sl.meta, sl.state = m, slotRegistered
	p.byHash.Set(m.Seq, s)
	p.ev.stored(p.tier, m)
	p.release(s)
	return true
}

// drop unregisters a block whose bytes failed verification; a pinned one is
// freed on its last release.
func (p *pool) drop(s int32) {
	sl := &p.slots[s]
	if sl.state != slotRegistered {
		return
	}
	p.unregister(s)
	p.dropped++
	if sl.ref == 0 {
		if sl.listed {
			p.unlist(s)
		}
		sl.state = slotFree
		p.free = append(p.free, s)
		return
	}
	sl.state = slotDropped
}

func (p *pool) unregister(s int32) {
	sl := &p.slots[s]
	p.byHash.Delete(sl.meta.Seq)
	sl.state = slotFree
	p.ev.removed(p.tier, sl.meta.Seq)
}

func (p *pool) list(s int32) {
	sl := &p.slots[s]
	pr := sl.meta.Priority
	l := p.lists[pr]
	if l == nil {
		l = &lru{head: -1, tail: -1}
		p.lists[pr] = l
	}
	if l.head < 0 {
		i, _ := slices.BinarySearch(p.prios, pr)
		p.prios = slices.Insert(p.prios, i, pr)
	}
	sl.prev, sl.next, sl.listed = l.tail, -1, true
	if l.tail >= 0 {
		p.slots[l.tail].next = s
	} else {
		l.head = s
	}
	l.tail = s
}

func (p *pool) unlist(s int32) {
	sl := &p.slots[s]
	pr := sl.meta.Priority
	l := p.lists[pr]
	if sl.prev >= 0 {
		p.slots[sl.prev].next = sl.next
	} else {
		l.head = sl.next
	}
	if sl.next >= 0 {
		p.slots[sl.next].prev = sl.prev
	} else {
		l.tail = sl.prev
	}
	sl.listed, sl.prev, sl.next = false, -1, -1
	if l.head < 0 {
		i, _ := slices.BinarySearch(p.prios, pr)
		p.prios = slices.Delete(p.prios, i, i+1)
	}
}
