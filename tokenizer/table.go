package tokenizer

import (
	"encoding/binary"
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
// probing, load ≤ 1/2). Keys of up to shortKeyBytes bytes — most tokens,
// and nearly every piece a lookup is made for — live in a table of their
// own, keyed by the bytes packed in an integer: a lookup there is a
// multiply and one slot read, with no call to hash the string and no
// second read of the key's bytes elsewhere.
type vocabTable struct {
	seed  maphash.Seed
	keys  string
	slots []vocabSlot
	mask  uint64

	short      []shortSlot
	shortShift uint
}

// vocabSlot is one key: keys[off:off+n], its id and its hash's high half
// (compared before the bytes). n == 0 marks an empty slot: no key is empty.
type vocabSlot struct{ off, n, id, tag uint32 }

// shortKeyBytes is the longest key the packed table holds.
const shortKeyBytes = 8

// shortSlot is one key of at most shortKeyBytes bytes: key holds them
// little-endian, zero-padded (n tells "a" from "a\x00"); n == 0 marks an
// empty slot.
type shortSlot struct {
	key   uint64
	id, n uint32
}

// packShort is s's bytes little-endian in an integer; len(s) ≤ shortKeyBytes.
// Two loads that overlap in the middle cover any length from 2 to 8 (the
// overlapping bytes are equal, so OR keeps them); each load the compiler
// makes one instruction.
func packShort(s string) uint64 {
	switch n := len(s); {
	case n >= 4:
		return uint64(le32(s)) | uint64(le32(s[n-4:]))<<(8*(n-4))
	case n >= 2:
		return uint64(le16(s)) | uint64(le16(s[n-2:]))<<(8*(n-2))
	case n == 1:
		return uint64(s[0])
	}
	return 0
}

func le32(s string) uint32 {
	_ = s[3]
	return uint32(s[0]) | uint32(s[1])<<8 | uint32(s[2])<<16 | uint32(s[3])<<24
}

func le16(s string) uint16 {
	_ = s[1]
	return uint16(s[0]) | uint16(s[1])<<8
}

// shortHome is the first slot probed for a packed key of n bytes.
func (v *vocabTable) shortHome(k uint64, n int) uint64 {
	return ((k + uint64(n)) * 0x9E3779B97F4A7C15) >> v.shortShift
}

// vocabEntry is one key and id for newVocabTable.
type vocabEntry struct {
	key string
	id  uint32
}

// newVocabTable builds the table; a repeated key keeps its last id, as
// assigning to a map does. Empty keys are left out.
func newVocabTable(entries []vocabEntry) *vocabTable {
	nShort := 0
	for _, e := range entries {
		if len(e.key) <= shortKeyBytes {
			nShort++
		}
	}
	size := uint64(1) << bits.Len(uint(2*(len(entries)-nShort)))
	shortBits := bits.Len(uint(2 * nShort))
	v := &vocabTable{
		seed: maphash.MakeSeed(), slots: make([]vocabSlot, size), mask: size - 1,
		short: make([]shortSlot, 1<<shortBits), shortShift: uint(64 - shortBits),
	}
	n := 0
	for _, e := range entries {
		n += len(e.key)
	}
	keys := make([]byte, 0, n)
	for _, e := range entries {
		if e.key == "" {
			continue
		}
		if len(e.key) <= shortKeyBytes {
			v.putShort(e.key, e.id)
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

func (v *vocabTable) putShort(s string, id uint32) {
	k, mask := packShort(s), uint64(len(v.short)-1)
	for i := v.shortHome(k, len(s)); ; i = (i + 1) & mask {
		sl := &v.short[i]
		if sl.n == 0 {
			*sl = shortSlot{key: k, id: id, n: uint32(len(s))}
			return
		}
		if sl.key == k && int(sl.n) == len(s) {
			sl.id = id
			return
		}
	}
}

// get is s's id.
func (v *vocabTable) get(s string) (uint32, bool) {
	if len(s) <= shortKeyBytes {
		return v.getShort(s)
	}
	return v.getLong(s, maphash.String(v.seed, s))
}

// getShort is get of a key of at most shortKeyBytes bytes.
func (v *vocabTable) getShort(s string) (uint32, bool) {
	return v.getPacked(packShort(s), len(s))
}

// getPacked is getShort of the key of n bytes that packShort packs to k.
func (v *vocabTable) getPacked(k uint64, n int) (uint32, bool) {
	mask := uint64(len(v.short) - 1)
	for i := v.shortHome(k, n); ; i = (i + 1) & mask {
		sl := &v.short[i]
		if sl.n == 0 {
			return 0, false
		}
		if sl.key == k && int(sl.n) == n {
			return sl.id, true
		}
	}
}

// packAt is packShort(s[i:i+n]) for n ≤ shortKeyBytes, read with one load
// when eight bytes from i lie within s.
func packAt(s string, i, n int) uint64 {
	if i+8 <= len(s) {
		return binary.LittleEndian.Uint64([]byte(s[i:i+8])) & (^uint64(0) >> (64 - 8*n))
	}
	return packShort(s[i : i+n])
}

// getLong is get of a key longer than shortKeyBytes, with its hash
// (v.hash(s)) already known.
func (v *vocabTable) getLong(s string, h uint64) (uint32, bool) {
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
