package index

import (
	"math/bits"
	"unsafe"

	"github.com/kvmesh/kvmesh/internal/mix"
)

// engTable maps a node's shared engine hash to the node. Only the writer
// uses it (readers never resolve engine hashes), so it is plain memory:
// one 32-bit word per slot holding the node id in its low idBits bits and
// a tag of the hash (its top bits) above, so a probe passing other keys
// compares tags and never loads their nodes, and a probe, its insert and
// its tag all touch one cache line. idBits covers every node id with a
// bit to spare (chosen at each rebuild, which an id past it forces), so
// the tag is as wide as the index is small: 10 bits at 1.4M nodes.
// Linear probing, power-of-two size.
type engTable struct {
	slots      []uint32 // etabEmpty, etabDead, or tag<<idBits | id
	mask       uint64
	idBits     uint   // bits of a slot's id (the tag has the rest)
	idMask     uint32 // 1<<idBits - 1; ids stay below it (all ones is etabDead's id)
	used, dead int
}

// minIDBits is the narrowest id field (a 16-bit tag below 32k nodes).
const minIDBits = 16

const (
	etabEmpty = 0 // no live node has id 0 (the root has no engine hash)
	etabDead  = ^uint32(0)
)

// newEngTable returns a table for n entries, at most half full, whose
// slots fit ids up to maxID.
func newEngTable(n int, maxID uint32) engTable {
	size := 1024
	for size < n*2 {
		size <<= 1
	}
	ib := uint(min(max(bits.Len32(maxID)+1, minIDBits), 32))
	return engTable{slots: make([]uint32, size), mask: uint64(size - 1), idBits: ib, idMask: uint32(1<<ib - 1)}
}

// tag is hash's tag in t (the bits a slot's id leaves; none at 32-bit ids).
func (t *engTable) tag(hash uint64) uint32 { return uint32(hash >> (32 + t.idBits)) }

// etabPrefetch brings in the slot a probe for table hash hash starts at.
func (ix *Index) etabPrefetch(hash uint64) {
	t := &ix.etab
	prefetch(uintptr(unsafe.Pointer(&t.slots[hash&t.mask])))
}

func (ix *Index) engHash(h uint64) uint64 { return mix.Mix64(h ^ ix.seed) }

// etabFind returns the node whose shared engine hash is h, or 0 and the
// slot where h belongs.
func (ix *Index) etabFind(h uint64) (id uint32, ins int) {
	return ix.etabFindHashed(h, ix.engHash(h))
}

// etabFindHashed is etabFind with h's table hash (engHash) known.
func (ix *Index) etabFindHashed(h, hash uint64) (id uint32, ins int) {
	t := &ix.etab
	tg := t.tag(hash)
	dir := *ix.dir.Load()
	ins = -1
	for i := hash & t.mask; ; i = (i + 1) & t.mask {
		s := t.slots[i]
		switch {
		case s == etabEmpty:
			if ins < 0 {
				ins = int(i)
			}
			return 0, ins
		case s == etabDead:
			if ins < 0 {
				ins = int(i)
			}
		case s>>t.idBits == tg:
			id := s & t.idMask
			c := dir[id>>chunkBits]
			if c.eng[id&chunkMask] == h && c.nc[id&chunkMask]&hasEngBit != 0 {
				return id, int(i)
			}
		}
	}
}

// etabInsert records id under h at slot ins (from a failed etabFind with
// no table change since).
func (ix *Index) etabInsert(h uint64, id uint32, ins int) {
	ix.etabInsertHashed(h, ix.engHash(h), id, ins)
}

// etabInsertHashed is etabInsert with h's table hash (engHash) known.
func (ix *Index) etabInsertHashed(h, hash uint64, id uint32, ins int) {
	t := &ix.etab
	// Up to 7/8 full: a probe passing other keys compares their tags
	// only (a long run is a line or two of slots), and a fuller table is
	// fewer bytes per entry and fewer rebuilds (each Sharded shard's
	// table held half the entries in as many slots as one index's at 3/4).
	if (t.used+t.dead+1)*8 > len(t.slots)*7 || id >= t.idMask {
		ix.etabRebuild(id)
		_, ins = ix.etabFindHashed(h, hash)
	}
	if t.slots[ins] == etabDead {
		t.dead--
	}
	t.slots[ins] = t.tag(hash)<<t.idBits | id
	t.used++
}

// etabRebuild makes a new table holding every node with a shared hash
// except skip (whose insert is under way). It walks the nodes in id order,
// reading their hashes sequentially rather than chasing each entry of the
// old table to a random node. A table past the cache is filled in slot
// order: the entries are first sorted by home slot (a counting sort on
// its top bits), so the inserts sweep the table instead of each missing
// the cache at a random slot.
func (ix *Index) etabRebuild(skip uint32) {
	nt := newEngTable(ix.etab.used+1, max(ix.next, skip))
	dir := *ix.dir.Load()
	each := func(f func(hash uint64, id uint32)) {
		for ci, c := range dir {
			for k := range c.nc {
				id := uint32(ci)<<chunkBits | uint32(k)
				if c.nc[k]&hasEngBit == 0 || id == skip || id >= ix.next {
					continue
				}
				f(ix.engHash(c.eng[k]), id)
			}
		}
	}
	put := func(j uint64, word uint32) {
		for nt.slots[j] != etabEmpty {
			j = (j + 1) & nt.mask
		}
		nt.slots[j] = word
		nt.used++
	}
	if len(nt.slots) <= rebuildSortedFrom {
		each(func(hash uint64, id uint32) { put(hash&nt.mask, nt.tag(hash)<<nt.idBits|id) })
		ix.etab = nt
		return
	}
	// Buckets of rebuildBucket slots; an entry is its home slot and its
	// slot word.
	shift := uint(bits.Len(rebuildBucket - 1))
	pos := make([]int, len(nt.slots)/rebuildBucket+1)
	each(func(hash uint64, _ uint32) { pos[(hash&nt.mask)>>shift+1]++ })
	for b := 1; b < len(pos); b++ {
		pos[b] += pos[b-1]
	}
	sorted := make([]uint64, pos[len(pos)-1])
	each(func(hash uint64, id uint32) {
		b := (hash & nt.mask) >> shift
		sorted[pos[b]] = (hash&nt.mask)<<32 | uint64(nt.tag(hash)<<nt.idBits|id)
		pos[b]++
	})
	for _, e := range sorted {
		put(e>>32, uint32(e))
	}
	ix.etab = nt
}

// rebuildSortedFrom is the table size (slots) from which etabRebuild
// sorts the entries first; rebuildBucket the slots per bucket of that
// sort (64 KB: its inserts stay in L2 while it fills).
const (
	rebuildSortedFrom = 1 << 17
	rebuildBucket     = 1 << 14
)

func (ix *Index) etabDelete(h uint64, id uint32) {
	t := &ix.etab
	hash := ix.engHash(h)
	want := t.tag(hash)<<t.idBits | id
	for i := hash & t.mask; t.slots[i] != etabEmpty; i = (i + 1) & t.mask {
		if t.slots[i] == want {
			t.slots[i] = etabDead
			t.used--
			t.dead++
			return
		}
	}
}
