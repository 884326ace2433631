package router

import "github.com/kvmesh/kvmesh/kv"

// blockSet is a refcounted set of sequence hashes: an open-addressing table
// with linear probing. Sequence hashes are already uniformly distributed,
// so their low bits index the table directly and no hashing is needed; this
// makes booking a 512-block request several times cheaper than a Go map.
//
// A key whose count drops to zero leaves its slot at once, the later keys
// of its probe run shifting back (backward-shift deletion), so the table
// holds no tombstones and never needs sweeping: requests come and go at a
// high rate, and sweeping a table sized for the peak cost more than the
// bookings. A key and its count share a slot (one cache line per probe).
// The table grows to keep live keys at most half of it and keeps its peak
// size, so a worker cycling through requests does not reallocate.
type blockSet struct {
	slots   []blockSlot // key 0 marks an empty slot
	n       int         // live keys (count > 0), including zero
	zero    int32       // refcount of the key 0
	touched kv.SeqHash  // keeps warm's loads
}

type blockSlot struct {
	key   kv.SeqHash
	count int32
}

const minBlockSet = 64

func (s *blockSet) len() int { return s.n }

func (s *blockSet) has(h kv.SeqHash) bool {
	if h == 0 {
		return s.zero > 0
	}
	if len(s.slots) == 0 {
		return false
	}
	mask := kv.SeqHash(len(s.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		switch s.slots[i].key {
		case h:
			return true
		case 0:
			return false
		}
	}
}

// warm loads the home slots of hs before a request's blocks are booked or
// released one by one, so that their cache misses overlap instead of
// queueing (a request's blocks are spread over the whole table).
func (s *blockSet) warm(hs []kv.SeqHash) {
	if len(s.slots) == 0 {
		return
	}
	mask := kv.SeqHash(len(s.slots) - 1)
	var t kv.SeqHash
	for _, h := range hs {
		t += s.slots[h&mask].key
	}
	s.touched += t
}

// inc adds one reference to h.
func (s *blockSet) inc(h kv.SeqHash) {
	if h == 0 {
		if s.zero == 0 {
			s.n++
		}
		s.zero++
		return
	}
	if 2*(s.n+1) > len(s.slots) {
		s.grow()
	}
	mask := kv.SeqHash(len(s.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		switch s.slots[i].key {
		case h:
			s.slots[i].count++
			return
		case 0:
			s.slots[i] = blockSlot{h, 1}
			s.n++
			return
		}
	}
}

// dec drops one reference to h; absent keys are ignored.
func (s *blockSet) dec(h kv.SeqHash) {
	if h == 0 {
		if s.zero > 0 {
			if s.zero--; s.zero == 0 {
				s.n--
			}
		}
		return
	}
	if len(s.slots) == 0 {
		return
	}
	mask := kv.SeqHash(len(s.slots) - 1)
	i := h & mask
	for ; s.slots[i].key != h; i = (i + 1) & mask {
		if s.slots[i].key == 0 {
			return
		}
	}
	if s.slots[i].count--; s.slots[i].count > 0 {
		return
	}
	s.n--
	for j := i; ; {
		j = (j + 1) & mask
		kj := s.slots[j].key
		if kj == 0 {
			s.slots[i] = blockSlot{}
			return
		}
		// kj may move to the hole at i unless its home lies cyclically in (i, j].
		if (j-kj)&mask >= (j-i)&mask {
			s.slots[i] = s.slots[j]
			i = j
		}
	}
}

// grow doubles the table (or makes the first one) and reinserts the keys.
func (s *blockSet) grow() {
	size := max(2*len(s.slots), minBlockSet)
	old := s.slots
	s.slots = make([]blockSlot, size)
	mask := kv.SeqHash(size - 1)
	for _, sl := range old {
		if sl.key == 0 {
			continue
		}
		i := sl.key & mask
		for s.slots[i].key != 0 {
			i = (i + 1) & mask
		}
		s.slots[i] = sl
	}
}
