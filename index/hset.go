package index

import (
	"slices"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/internal/mix"
	"github.com/kvmesh/kvmesh/kv"
)

// Shared holder sets. A node with more than two holders points to an
// immutable holder set, and nodes with equal holders share one set
// (interned by content): a chain stored by the same workers costs one set,
// and a reader that sees the same holders word on consecutive levels knows
// that nobody dropped out there. A change builds or finds another set (copy
// on write); a set is freed when its last node leaves it. The holders word
// names the set by index and generation, and a reader accepts a loaded set
// only if its generation matches, so a recycled index is never mistaken
// for the set the word named.

// hset is one immutable holder set.
type hset struct {
	ent  []uint32 // slot<<4 | tier mask, ascending slot
	cum  []uint64 // [(k-lo)*NumTiers+t]: slots of 64-slot word k holding on tier t or faster
	lo   int      // first 64-slot word cum covers; cum is nil for a set spread thin over many slots
	gen  uint32   // generation the set was published under (31 bits)
	idx  uint32   // its index (writer)
	refs int      // nodes pointing to it (writer)
	hash uint64   // content hash (writer)
	// Small sets keep ent and cum inside the object: one cache miss less
	// for a reader meeting a set (256 workers span four 64-slot words).
	entBuf [8]uint32
	cumBuf [4 * kv.NumTiers]uint64
}

type ovfChunk [chunkSize]atomic.Pointer[hset]

const genMask = 0x7FFFFFFF

func ovfWord(idx, gen uint32) uint64 { return ovfFlag | uint64(gen&genMask)<<32 | uint64(idx) }

// setOf returns the set holders word h names, or nil if that set was
// freed since h was read (only a lock-free reader can see that).
func (ix *Index) setOf(h uint64) *hset {
	idx := uint32(h)
	d := *ix.ovfDir.Load()
	if int(idx>>chunkBits) >= len(d) {
		return nil
	}
	hs := d[idx>>chunkBits][idx&chunkMask].Load()
	if hs == nil || hs.gen != uint32(h>>32)&genMask {
		return nil
	}
	return hs
}

// mask returns slot's tier mask in the set.
func (hs *hset) mask(slot uint32) uint8 {
	i, ok := slices.BinarySearchFunc(hs.ent, slot, func(e, s uint32) int {
		switch {
		case e>>4 < s:
			return -1
		case e>>4 > s:
			return 1
		}
		return 0
	})
	if !ok {
		return 0
	}
	return uint8(hs.ent[i] & 15)
}

// entHash is a set's content hash: a sum over its entries, so a set made
// from another by one change hashes in O(1) (withMask adds and subtracts
// entMix terms) rather than over all its entries, which at thousands of
// holders was a pass per event.
func entHash(ent []uint32) uint64 {
	var h uint64
	for _, e := range ent {
		h += entMix(e)
	}
	return h
}

func entMix(e uint32) uint64 { return mix.Mix64(uint64(e) + mix.Golden) }

// intern returns the holders word of the set with entries ent (sorted,
// more than two) and content hash hash, taking a reference to it. base,
// when not nil, is a set ent differs from in slot's entry alone: its
// bitsets are copied and patched rather than rebuilt entry by entry.
func (ix *Index) intern(ent []uint32, hash uint64, base *hset, slot uint32) uint64 {
	idx, shared := ix.sets[hash]
	if shared {
		if hs := (*ix.ovfDir.Load())[idx>>chunkBits][idx&chunkMask].Load(); slices.Equal(hs.ent, ent) {
			hs.refs++
			return ovfWord(idx, hs.gen)
		}
		// A hash collision: the new set stays private.
	}
	if len(ent) > len(hset{}.entBuf) {
		ent = slices.Clone(ent)
	}
	return ix.newSet(ent, hash, base, slot, shared)
}

// newSet publishes a new set with entries ent, which it keeps when they
// do not fit in the set's own buffer (the caller gives them up), and
// interns it by hash unless shared (another set holds that hash).
func (ix *Index) newSet(ent []uint32, hash uint64, base *hset, slot uint32, shared bool) uint64 {
	var idx uint32
	if k := len(ix.ovfFree); k > 0 {
		idx = ix.ovfFree[k-1]
		ix.ovfFree = ix.ovfFree[:k-1]
	} else {
		idx = ix.ovfNext
		ix.ovfNext++
		d := *ix.ovfDir.Load()
		if int(idx>>chunkBits) >= len(d) {
			nd := append(append(make([]*ovfChunk, 0, len(d)+1), d...), new(ovfChunk))
			ix.ovfDir.Store(&nd)
		}
	}
	ix.ovfGen = (ix.ovfGen + 1) & genMask
	hs := &hset{gen: ix.ovfGen, idx: idx, refs: 1, hash: hash}
	if len(ent) <= len(hs.entBuf) {
		hs.ent = append(hs.entBuf[:0], ent...)
	} else {
		hs.ent = ent
	}
	// Readers want per-tier bitsets; they cost 32 bytes per 64 slots
	// spanned, so a few holders far apart keep only their entries and
	// readers expand them on the fly.
	hs.lo = int(ent[0] >> 10)
	if span := int(ent[len(ent)-1]>>10) - hs.lo + 1; span <= len(ent)/8+8 {
		n := span * kv.NumTiers
		if n <= len(hs.cumBuf) {
			hs.cum = hs.cumBuf[:n]
		} else {
			hs.cum = make([]uint64, n)
		}
		if base != nil && base.cum != nil && base.lo == hs.lo && len(base.cum) == n {
			copy(hs.cum, base.cum)
			patchCum(hs.cum, hs.lo, slot, hs.mask(slot))
		} else {
			fillCum(hs.cum, hs.lo, ent)
		}
	}
	(*ix.ovfDir.Load())[idx>>chunkBits][idx&chunkMask].Store(hs)
	if !shared {
		ix.sets[hash] = idx
	}
	ix.st.HolderSets++
	return ovfWord(idx, hs.gen)
}

// fillCum sets, for each entry, its slot's bit on each tier it holds the
// block on or faster, in bitsets starting at 64-slot word lo; entries
// beyond cum are skipped.
func fillCum(cum []uint64, lo int, ent []uint32) {
	for _, e := range ent {
		k := (int(e>>10) - lo) * kv.NumTiers
		if k < 0 || k+kv.NumTiers > len(cum) {
			continue
		}
		bit := uint64(1) << (e >> 4 & 63)
		for t := lowTier(uint8(e & 15)); t < kv.NumTiers; t++ {
			cum[k+int(t)] |= bit
		}
	}
}

// patchCum sets slot's bits in bitsets cum (starting at 64-slot word lo)
// to what tier mask m gives: set on each tier m holds or a slower one.
func patchCum(cum []uint64, lo int, slot uint32, m uint8) {
	k := (int(slot>>6) - lo) * kv.NumTiers
	bit := uint64(1) << (slot & 63)
	low := int(lowTier(m))
	for t := 0; t < kv.NumTiers; t++ {
		if t >= low {
			cum[k+t] |= bit
		} else {
			cum[k+t] &^= bit
		}
	}
}

// bitsets returns hs's per-tier bitsets and the word they start at,
// expanding them into tmp (W words) when the set keeps none.
func (hs *hset) bitsets(tmp []uint64) ([]uint64, int) {
	if hs.cum != nil {
		return hs.cum, hs.lo
	}
	clear(tmp)
	fillCum(tmp, 0, hs.ent)
	return tmp, 0
}

// release drops a reference to the set h names, freeing it with the last.
func (ix *Index) release(h uint64) {
	hs := ix.setOf(h)
	if hs.refs--; hs.refs > 0 {
		return
	}
	if x, ok := ix.sets[hs.hash]; ok && x == hs.idx {
		delete(ix.sets, hs.hash)
	}
	(*ix.ovfDir.Load())[hs.idx>>chunkBits][hs.idx&chunkMask].Store(nil)
	ix.ovfFree = append(ix.ovfFree, hs.idx)
	ix.st.HolderSets--
}

// transition is the last holders change made by setMask: consecutive
// blocks of one event usually make the same one (chain nodes share a set).
type transition struct {
	from, to uint64
	slot     uint32
	m        uint8
	had      uint8 // slot's mask in from (maskOf answers from it)
}

// withMask returns holders word h with slot's mask set to m (0 removes
// the holder), taking a reference to any set it names. It does not release h.
func (ix *Index) withMask(h uint64, slot uint32, m uint8) uint64 {
	if t := &ix.memo; t.from == h && t.slot == slot && t.m == m {
		if t.to&ovfFlag == 0 {
			return t.to
		}
		if hs := ix.setOf(t.to); hs != nil {
			hs.refs++
			return t.to
		}
	}
	ent := ix.entBuf[:0]
	var base *hset
	if h&ovfFlag != 0 {
		base = ix.setOf(h)
		if out, had, ok := ix.withMaskNew(base, slot, m); ok {
			ix.memo = transition{from: h, to: out, slot: slot, m: m, had: had}
			return out
		}
		ent = append(ent, base.ent...)
	} else {
		for _, e := range [2]uint32{uint32(h), uint32(h >> 32)} {
			if e != 0 {
				ent = append(ent, e)
			}
		}
		if len(ent) == 2 && ent[0]>>4 > ent[1]>>4 {
			ent[0], ent[1] = ent[1], ent[0]
		}
	}
	i, found := slices.BinarySearchFunc(ent, slot, func(e, s uint32) int { return int(e>>4) - int(s) })
	ne := slot<<4 | uint32(m)
	var hash uint64
	if base != nil {
		hash = base.hash
	}
	var had uint8
	if found {
		had = uint8(ent[i] & 15)
	}
	switch {
	case found && m == 0:
		hash -= entMix(ent[i])
		ent = slices.Delete(ent, i, i+1)
	case found:
		hash += entMix(ne) - entMix(ent[i])
		ent[i] = ne
	case m != 0:
		hash += entMix(ne)
		ent = slices.Insert(ent, i, ne)
	}
	ix.entBuf = ent
	var out uint64
	switch len(ent) {
	case 0:
	case 1:
		out = uint64(ent[0])
	case 2:
		out = uint64(ent[0]) | uint64(ent[1])<<32
	default:
		if base == nil {
			hash = entHash(ent)
		}
		out = ix.intern(ent, hash, base, slot)
	}
	if (h|out)&ovfFlag != 0 {
		ix.memo = transition{from: h, to: out, slot: slot, m: m, had: had}
	}
	return out
}

// withMaskNew returns the holders word of base with slot's mask set to m
// when that is a new set too large for a set's own buffer, building its
// entries straight into their own array: one copy of base's entries,
// where withMask's scratch copy, its insert and intern's clone made
// three (a worker joining a chain that thousands of workers hold copies
// them all, and in the 7,000-worker replay no such set already exists).
// ok is false when withMask must do it (a small or unchanged set, or one
// whose content hash is interned already); had is slot's mask in base.
func (ix *Index) withMaskNew(base *hset, slot uint32, m uint8) (out uint64, had uint8, ok bool) {
	i, found := slices.BinarySearchFunc(base.ent, slot, func(e, s uint32) int { return int(e>>4) - int(s) })
	ne := slot<<4 | uint32(m)
	if found {
		had = uint8(base.ent[i] & 15)
	}
	hash, n := base.hash, len(base.ent)
	switch {
	case found && m == 0:
		hash -= entMix(base.ent[i])
		n--
	case found:
		hash += entMix(ne) - entMix(base.ent[i])
	case m != 0:
		hash += entMix(ne)
		n++
	default:
		return 0, 0, false
	}
	if n <= len(hset{}.entBuf) {
		return 0, 0, false
	}
	if _, shared := ix.sets[hash]; shared {
		return 0, 0, false
	}
	ent := make([]uint32, n)
	copy(ent, base.ent[:i])
	switch {
	case found && m == 0:
		copy(ent[i:], base.ent[i+1:])
	case found:
		ent[i] = ne
		copy(ent[i+1:], base.ent[i+1:])
	default:
		ent[i] = ne
		copy(ent[i+1:], base.ent[i:])
	}
	return ix.newSet(ent, hash, base, slot, false), had, true
}
