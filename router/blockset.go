package router

import "github.com/kvmesh/kvmesh/kv"

// blockSet is a refcounted set of sequence hashes: an open-addressing table
// with linear probing. Sequence hashes are already uniformly distributed,
// so their low bits index the table directly and no hashing is needed; this
// makes booking a 512-block request several times cheaper than a Go map.
//
// A key whose count drops to zero stays in its slot as a tombstone (a later
// inc of the same key revives it); tombstones are swept when live keys plus
// tombstones would pass half the table. The table keeps its peak size
// (24 bytes a slot with its spare, at most four times a worker's peak
// active blocks), so a
// worker cycling through requests does not reallocate.
type blockSet struct {
	keys   []kv.SeqHash
	counts []int32
	n      int   // live keys (count > 0), including zero
	used   int   // occupied slots: live plus tombstones
	zero   int32 // refcount of the key 0, which marks empty slots

	// A second table of the same size to rehash into without allocating.
	spareK []kv.SeqHash
	spareC []int32
}

const minBlockSet = 64

func (s *blockSet) len() int { return s.n }

func (s *blockSet) has(h kv.SeqHash) bool {
	if h == 0 {
		return s.zero > 0
	}
	if len(s.keys) == 0 {
		return false
	}
	mask := uint64(len(s.keys) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		switch s.keys[i] {
		case h:
			return s.counts[i] > 0
		case 0:
			return false
		}
	}
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
	if 2*(s.used+1) > len(s.keys) {
		s.rehash()
	}
	mask := uint64(len(s.keys) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		switch s.keys[i] {
		case h:
			if s.counts[i] == 0 {
				s.n++
			}
			s.counts[i]++
			return
		case 0:
			s.keys[i], s.counts[i] = h, 1
			s.n++
			s.used++
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
	if len(s.keys) == 0 {
		return
	}
	mask := uint64(len(s.keys) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		switch s.keys[i] {
		case 0:
			return
		case h:
			if s.counts[i] > 0 {
				if s.counts[i]--; s.counts[i] == 0 {
					s.n--
				}
			}
			return
		}
	}
}

// rehash drops tombstones, growing the table when live keys alone would
// fill more than a quarter of it.
func (s *blockSet) rehash() {
	size := max(len(s.keys), minBlockSet)
	for 4*(s.n+1) > size {
		size *= 2
	}
	oldK, oldC := s.keys, s.counts
	if size == len(oldK) && s.n == 0 {
		clear(s.keys) // nothing live: just wipe the tombstones
		clear(s.counts)
		s.used = 0
		return
	}
	if len(s.spareK) != size {
		s.spareK, s.spareC = make([]kv.SeqHash, size), make([]int32, size)
	}
	s.keys, s.counts, s.spareK, s.spareC = s.spareK, s.spareC, oldK, oldC
	defer func() { clear(s.spareK); clear(s.spareC) }()
	if size != len(oldK) {
		s.spareK, s.spareC = nil, nil // the old size is no use any more
	}
	s.used = 0
	mask := uint64(size - 1)
	for k, h := range oldK {
		if h == 0 || oldC[k] == 0 {
			continue
		}
		i := h & mask
		for s.keys[i] != 0 {
			i = (i + 1) & mask
		}
		s.keys[i], s.counts[i] = h, oldC[k]
		s.used++
	}
}
