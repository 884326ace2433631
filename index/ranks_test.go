package index

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

// TestRankOrder checks the blocked rank order against a sorted slice
// through random joins and leaves, enough to split blocks and empty
// them, and that a view's flattened order never changes after a later
// change of the writer's.
func TestRankOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	keys := map[uint32]kv.WorkerKey{}
	keyOf := func(sl uint32) kv.WorkerKey { return keys[sl] }
	var o rankOrder
	var want []uint32 // slots by key
	type snap struct {
		v    *view
		want []uint32
	}
	var snaps []snap
	next := uint32(0)
	for step := range 20000 {
		if len(want) == 0 || r.IntN(3) != 0 {
			sl := next
			next++
			w := kv.WorkerKey{Instance: r.Uint64N(1 << 20), DPRank: uint32(sl)}
			keys[sl] = w
			b, i := o.find(w, keyOf)
			o.insert(b, i, sl)
			k, _ := slices.BinarySearchFunc(want, w, func(s uint32, w kv.WorkerKey) int { return cmpKey(keys[s], w) })
			want = slices.Insert(want, k, sl)
		} else {
			k := r.IntN(len(want))
			o.remove(o.find(keys[want[k]], keyOf))
			want = slices.Delete(want, k, k+1)
		}
		if o.n != len(want) {
			t.Fatalf("step %d: %d entries, want %d", step, o.n, len(want))
		}
		if step%97 == 0 {
			v := &view{ord: o}
			if got := v.ranks(); !slices.Equal(got, want) {
				t.Fatalf("step %d: order %v, want %v", step, got, want)
			}
			snaps = append(snaps, snap{&view{ord: o}, slices.Clone(want)})
		}
	}
	for _, s := range snaps {
		if got := s.v.ranks(); !slices.Equal(got, s.want) {
			t.Fatalf("a view's order changed after it was published")
		}
	}
	for _, bl := range o.blocks {
		if len(bl) == 0 || len(bl) > 2*rankBlock {
			t.Fatalf("a block of %d entries", len(bl))
		}
	}
}
