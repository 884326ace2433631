package index

import "github.com/kvmesh/kvmesh/internal/mix"

// engTable maps a node's shared engine hash to the node. Only the writer
// uses it (readers never resolve engine hashes), so it is plain memory: a
// node id per slot plus a parallel byte of hash tag, so a probe that misses
// reads only the tag array and never a node (rather than a cache miss per
// occupied slot it passes; and the tags, a fifth of the table, stay in
// cache far longer than whole slots would). Linear probing, power-of-two
// size.
type engTable struct {
	ids        []uint32
	tags       []uint8 // tagEmpty, tagDead, or tagOf(hash)
	mask       uint64
	used, dead int
}

const (
	tagEmpty = 0
	tagDead  = 1
)

func tagOf(hash uint64) uint8 { return uint8(2 + (hash>>56)%254) }

func newEngTable(n int) engTable {
	size := 1024
	for size < n*2 {
		size <<= 1
	}
	return engTable{ids: make([]uint32, size), tags: make([]uint8, size), mask: uint64(size - 1)}
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
	tg := tagOf(hash)
	dir := *ix.dir.Load()
	ins = -1
	for i := hash & t.mask; ; i = (i + 1) & t.mask {
		switch t.tags[i] {
		case tagEmpty:
			if ins < 0 {
				ins = int(i)
			}
			return 0, ins
		case tagDead:
			if ins < 0 {
				ins = int(i)
			}
		case tg:
			id := t.ids[i]
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
	// Up to 7/8 full: a probe passing other keys reads their tag bytes
	// only (a long run is a line or two of tags), and a fuller table is
	// fewer bytes per entry and fewer rebuilds (each Sharded shard's
	// table held half the entries in as many slots as one index's at 3/4).
	if (t.used+t.dead+1)*8 > len(t.ids)*7 {
		ix.etabRebuild(id)
		_, ins = ix.etabFindHashed(h, hash)
	}
	if t.tags[ins] == tagDead {
		t.dead--
	}
	t.tags[ins] = tagOf(hash)
	t.ids[ins] = id
	t.used++
}

// etabRebuild makes a new table holding every node with a shared hash
// except skip (whose insert is under way). It walks the nodes in id order,
// reading their hashes sequentially rather than chasing each entry of the
// old table to a random node.
func (ix *Index) etabRebuild(skip uint32) {
	nt := newEngTable(ix.etab.used + 1)
	for ci, c := range *ix.dir.Load() {
		for k := range c.nc {
			id := uint32(ci)<<chunkBits | uint32(k)
			if c.nc[k]&hasEngBit == 0 || id == skip || id >= ix.next {
				continue
			}
			hash := ix.engHash(c.eng[k])
			j := hash & nt.mask
			for nt.tags[j] != tagEmpty {
				j = (j + 1) & nt.mask
			}
			nt.tags[j], nt.ids[j] = tagOf(hash), id
			nt.used++
		}
	}
	ix.etab = nt
}

func (ix *Index) etabDelete(h uint64, id uint32) {
	t := &ix.etab
	hash := ix.engHash(h)
	tg := tagOf(hash)
	for i := hash & t.mask; t.tags[i] != tagEmpty; i = (i + 1) & t.mask {
		if t.tags[i] == tg && t.ids[i] == id {
			t.tags[i] = tagDead
			t.used--
			t.dead++
			return
		}
	}
}
