package index

import (
	"slices"
	"sort"

	"github.com/kvmesh/kvmesh/kv"
)

// rankOrder is the live worker slots by ascending worker key, kept in
// blocks that no one changes once a view holds them: a join or leave
// copies one block and the list of blocks (a few hundred bytes at
// thousands of workers), where a flat order cost every view a copy of
// all of it, O(workers) per join, and a replay's warm-up has thousands of
// joins for few finds. Readers flatten a view's order once, when they
// first need it (view.ranks).
type rankOrder struct {
	blocks [][]uint32 // none empty; shared with published views: never written
	n      int
}

// rankBlock is a block's size after a split (it splits past twice that).
const rankBlock = 128

// find is where key w sits (or would) in o: block b, index i in it.
// keyOf gives a live slot's key.
func (o *rankOrder) find(w kv.WorkerKey, keyOf func(uint32) kv.WorkerKey) (b, i int) {
	// The first block whose last key is not below w.
	b = sort.Search(len(o.blocks), func(j int) bool {
		bl := o.blocks[j]
		return !less(keyOf(bl[len(bl)-1]), w)
	})
	if b == len(o.blocks) {
		if b == 0 {
			return 0, 0
		}
		b--
		return b, len(o.blocks[b])
	}
	bl := o.blocks[b]
	return b, sort.Search(len(bl), func(j int) bool { return !less(keyOf(bl[j]), w) })
}

// insert adds slot at block b, index i (from find).
func (o *rankOrder) insert(b, i int, slot uint32) {
	o.n++
	if len(o.blocks) == 0 {
		o.blocks = [][]uint32{{slot}}
		return
	}
	bl := o.blocks[b]
	nb := make([]uint32, len(bl)+1)
	copy(nb, bl[:i])
	nb[i] = slot
	copy(nb[i+1:], bl[i:])
	if len(nb) <= 2*rankBlock {
		o.blocks = slices.Clone(o.blocks)
		o.blocks[b] = nb
		return
	}
	h := len(nb) / 2
	o.blocks = slices.Insert(slices.Clone(o.blocks), b+1, nb[h:len(nb):len(nb)])
	o.blocks[b] = nb[:h:h]
}

// remove drops the entry at block b, index i.
func (o *rankOrder) remove(b, i int) {
	o.n--
	bl := o.blocks[b]
	if len(bl) == 1 {
		o.blocks = slices.Delete(slices.Clone(o.blocks), b, b+1)
		return
	}
	nb := append(slices.Clone(bl[:i]), bl[i+1:]...)
	o.blocks = slices.Clone(o.blocks)
	o.blocks[b] = nb
}

// ranks is the view's live slots by rank (ascending worker key). The
// first reader to ask flattens the view's blocks; readers racing it
// build equal copies, and any one of them is kept.
func (v *view) ranks() []uint32 {
	if f := v.flat.Load(); f != nil {
		return *f
	}
	f := make([]uint32, 0, v.ord.n)
	for _, bl := range v.ord.blocks {
		f = append(f, bl...)
	}
	v.flat.Store(&f)
	return f
}
