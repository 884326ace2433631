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
	full, grow int // used+dead past which an insert rebuilds (7/8), or starts a build (13/16)
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
	return engTable{slots: make([]uint32, size), mask: uint64(size - 1), idBits: ib, idMask: uint32(1<<ib - 1),
		full: size * 7 / 8, grow: size * 13 / 16}
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
	// A slot's tag bits in place: one mask and compare per slot passed.
	tg, idMask := t.tag(hash)<<(t.idBits&31), t.idMask
	slots, mask := t.slots, t.mask
	ins = -1
	for i := hash & mask; ; i = (i + 1) & mask {
		s := slots[i]
		switch {
		case s == etabEmpty:
			if ins < 0 {
				ins = int(i)
			}
			return 0, ins
		case s&^idMask == tg && s != etabDead:
			id := s & idMask
			dir := *ix.dir.Load()
			c := dir[id>>chunkBits]
			if c.eng[id&chunkMask] == h && c.nc[id&chunkMask]&hasEngBit != 0 {
				return id, int(i)
			}
		case s == etabDead:
			if ins < 0 {
				ins = int(i)
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
	if t.used+t.dead >= t.full || id >= t.idMask {
		ix.egrow = nil // the rebuild replaces any table being built
		ix.etabRebuild(id)
		_, ins = ix.etabFindHashed(h, hash)
	}
	if t.slots[ins] == etabDead {
		t.dead--
	}
	t.slots[ins] = t.tag(hash)<<t.idBits | id
	t.used++
	if g := ix.egrow; g != nil && id >= g.nt.idMask {
		ix.egrow = nil // the ids outgrew the new table: start again later
	} else if g != nil {
		g.note(hash, id, false)
		g.owed += g.step
	} else if t.used+t.dead > t.grow && len(t.slots) >= growFrom {
		ix.etabGrowStart()
	}
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
	rebuildBucket     = 1 << rebuildShift
	rebuildShift      = 14
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
			if ix.egrow != nil {
				ix.egrow.note(hash, id, true)
			}
			return
		}
	}
}

// growFrom is the table size (slots) from which the engine table grows
// across inserts (etabGrow) instead of in one rebuild inside an Apply: a
// rebuild of a table this small takes well under a millisecond. A
// variable so that tests can grow small tables that way.
var growFrom = 1 << 14

// etabGrow builds the next engine table a bounded step per insert while
// the current one keeps serving every lookup, insert and delete, so no
// single Apply pays for a whole rebuild. It does the work etabRebuild
// does, in three phases: walk the nodes in id order collecting each
// shared hash into buckets of rebuildBucket home slots (sequential node
// reads), fill the new table bucket by bucket (its inserts stay in
// cache), then replay the inserts and deletes the current table took
// meanwhile for nodes the walk had already passed (the log), and swap.
// It starts when the table is 13/16 full and sizes its steps to finish
// within half of the inserts left before 7/8; should the table reach 7/8
// anyway (or an id outgrow either table's id field) the ordinary rebuild
// runs and the build is dropped.
type etabGrow struct {
	nt      engTable
	phase   int          // growWalk, growFill, growLog
	cursor  uint32       // growWalk: the next node id to visit
	buckets [][][]uint64 // per bucket, its full blocks of growBlock entries
	cur     [][]uint64   // growWalk: per bucket, the block it fills (one array: no pointer to chase per entry)
	b, k    int          // growFill: bucket, block within it
	bi      int          // growFill: entry within the block
	log     []etabOp
	li      int // growLog: next op to replay
	step    int // units of work per insert
	owed    int // units the event's inserts owe, done at its end
}

// etabOp is an insert or delete of word (in the new table's encoding) at
// home slot hash&mask, taken by the current table during a build.
type etabOp struct {
	hash uint64
	word uint32
	del  bool
}

// growBlock is the entries of one block of a bucket. Buckets grow by
// blocks, not by append: the buckets fill at the same rate, so whole
// buckets grown by copying would all copy within a few Applies
// (megabytes), and made at full size at the start the first step would
// clear them all.
const growBlock = 512

const (
	growWalk = iota
	growFill
	growLog
)

// etabGrowStart sizes the next table for the current entries, as
// etabRebuild would, and starts building it.
func (ix *Index) etabGrowStart() {
	t := &ix.etab
	nt := newEngTable(t.used+1, ix.next)
	nb := max(1, len(nt.slots)/rebuildBucket)
	g := &etabGrow{nt: nt, cursor: 1, buckets: make([][][]uint64, nb), cur: make([][]uint64, nb)}
	// Work: one unit per node id walked, per entry filled and per op
	// replayed; spread over half the inserts left before the table is
	// 7/8 full.
	left := len(t.slots)*7/8 - (t.used + t.dead)
	g.step = 2*(int(ix.next)+t.used)/max(left, 1) + 8
	ix.egrow = g
}

// note logs a change to the current table for the new one, unless the
// walk has yet to reach id (it will read the node as it is then).
func (g *etabGrow) note(hash uint64, id uint32, del bool) {
	if g.phase == growWalk && id >= g.cursor {
		return
	}
	g.log = append(g.log, etabOp{hash: hash, word: g.nt.tag(hash)<<g.nt.idBits | id, del: del})
}

// etabGrowStep does the share of the build the event's inserts owe, and
// swaps the new table in when it is done. It runs at the end of an event
// (every node with a shared hash is then in the current table, and no
// probe's slot is held), in one piece rather than a few units per insert:
// the walk and fill stream better, and leave the insert path's lines
// alone, when they are not interleaved with it.
func (ix *Index) etabGrowStep() {
	g := ix.egrow
	nt := &g.nt
	n := max(g.owed, 1)
	g.owed = 0
	if g.phase == growWalk {
		dir := *ix.dir.Load()
		for ; n > 0 && g.cursor < ix.next; n-- {
			id := g.cursor
			g.cursor++
			c := dir[id>>chunkBits]
			if c.nc[id&chunkMask]&hasEngBit == 0 {
				continue
			}
			if id >= nt.idMask {
				ix.egrow = nil // the ids outgrew the new table: start again later
				return
			}
			hash := ix.engHash(c.eng[id&chunkMask])
			home := hash & nt.mask
			cur := &g.cur[home>>rebuildShift]
			if len(*cur) == cap(*cur) {
				if *cur != nil {
					g.buckets[home>>rebuildShift] = append(g.buckets[home>>rebuildShift], *cur)
				}
				*cur = make([]uint64, 0, growBlock)
			}
			*cur = append(*cur, home<<32|uint64(nt.tag(hash)<<nt.idBits|id))
		}
		if g.cursor < ix.next {
			return
		}
		for b, cur := range g.cur {
			if cur != nil {
				g.buckets[b] = append(g.buckets[b], cur)
			}
		}
		g.cur = nil
		g.phase = growFill
	}
	if g.phase == growFill {
		for n > 0 && g.b < len(g.buckets) {
			bk := g.buckets[g.b]
			if g.k == len(bk) {
				g.buckets[g.b] = nil
				g.b, g.k, g.bi = g.b+1, 0, 0
				continue
			}
			if g.bi == len(bk[g.k]) {
				g.k, g.bi = g.k+1, 0
				continue
			}
			e := bk[g.k][g.bi]
			g.bi++
			n--
			j := e >> 32
			for nt.slots[j] != etabEmpty {
				j = (j + 1) & nt.mask
			}
			nt.slots[j] = uint32(e)
			nt.used++
		}
		if g.b < len(g.buckets) {
			return
		}
		g.phase = growLog
	}
	for ; n > 0 && g.li < len(g.log); n-- {
		op := g.log[g.li]
		g.li++
		nt.apply(op)
	}
	if g.li == len(g.log) {
		ix.etab = *nt
		ix.egrow = nil
	}
}

// apply replays op on t: an insert takes the first free slot of its
// probe (the log never inserts a word t holds), a delete kills its word.
func (t *engTable) apply(op etabOp) {
	j := op.hash & t.mask
	if !op.del {
		for t.slots[j] != etabEmpty && t.slots[j] != etabDead {
			j = (j + 1) & t.mask
		}
		if t.slots[j] == etabDead {
			t.dead--
		}
		t.slots[j] = op.word
		t.used++
		return
	}
	for ; t.slots[j] != etabEmpty; j = (j + 1) & t.mask {
		if t.slots[j] == op.word {
			t.slots[j] = etabDead
			t.used--
			t.dead++
			return
		}
	}
}
