package tokenizer

import (
	"hash/maphash"
	"math/bits"
)

// A vocabulary held as Go strings costs the garbage collector a pointer
// per token: o200k's map[string]uint32 and []string (200k keys, 200k
// pieces, 125k small strings) made every GC cycle ~7 ms of marking, which
// every request pays in proportion to the bytes it allocates. These two
// tables hold the same in one string and flat arrays of integers, which
// the collector does not scan.

// pieceTable is every token's raw bytes, by id.
type pieceTable struct {
	blob string
	off  []uint32 // piece id is blob[off[id]:off[id+1]]
}

func newPieceTable(pieces []string) pieceTable {
	n := 0
	for _, p := range pieces {
		n += len(p)
	}
	b := make([]byte, 0, n)
	off := make([]uint32, len(pieces)+1)
	for i, p := range pieces {
		b = append(b, p...)
		off[i+1] = uint32(len(b))
	}
	return pieceTable{blob: string(b), off: off}
}

// len is the number of ids.
func (p *pieceTable) len() int { return max(len(p.off)-1, 0) }

// at is id's piece ("" for an unused id); id must be below len().
func (p *pieceTable) at(id uint32) string { return p.blob[p.off[id]:p.off[id+1]] }

// vocabTable maps a token's bytes to its id (open addressing, linear
// probing, load ≤ 1/2).
type vocabTable struct {
	seed  maphash.Seed
	keys  string
	slots []vocabSlot
	mask  uint64
}

// vocabSlot is one key: keys[off:off+n], its id and its hash's high half
// (compared before the bytes). n == 0 marks an empty slot: no key is empty.
type vocabSlot struct{ off, n, id, tag uint32 }

// vocabEntry is one key and id for newVocabTable.
type vocabEntry struct {
	key string
	id  uint32
}

// newVocabTable builds the table; a repeated key keeps its last id, as
// assigning to a map does. Empty keys are left out.
func newVocabTable(entries []vocabEntry) *vocabTable {
	size := uint64(1) << bits.Len(uint(2*len(entries)))
	v := &vocabTable{seed: maphash.MakeSeed(), slots: make([]vocabSlot, size), mask: size - 1}
	n := 0
	for _, e := range entries {
		n += len(e.key)
	}
	keys := make([]byte, 0, n)
	for _, e := range entries {
		if e.key == "" {
			continue
		}
		h := maphash.String(v.seed, e.key)
		for i := h & v.mask; ; i = (i + 1) & v.mask {
			sl := &v.slots[i]
			if sl.n == 0 {
				*sl = vocabSlot{off: uint32(len(keys)), n: uint32(len(e.key)), id: e.id, tag: uint32(h >> 32)}
				keys = append(keys, e.key...)
				break
			}
			if sl.tag == uint32(h>>32) && string(keys[sl.off:sl.off+sl.n]) == e.key {
				sl.id = e.id
				break
			}
		}
	}
	v.keys = string(keys)
	return v
}

// get is s's id.
func (v *vocabTable) get(s string) (uint32, bool) {
	return v.getHashed(s, maphash.String(v.seed, s))
}

// getHashed is get with s's hash (v.hash(s)) already known.
func (v *vocabTable) getHashed(s string, h uint64) (uint32, bool) {
	tag := uint32(h >> 32)
	for i := h & v.mask; ; i = (i + 1) & v.mask {
		sl := &v.slots[i]
		if sl.n == 0 {
			return 0, false
		}
		if sl.tag == tag && int(sl.n) == len(s) && v.keys[sl.off:sl.off+sl.n] == s {
			return sl.id, true
		}
	}
}
