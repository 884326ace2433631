package router

import (
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

// TestBlockSetAgainstMap drives the table and a map with the same random
// operations; keys are drawn from a small pool with clustered low bits so
// probe runs wrap and deletions shift.
func TestBlockSetAgainstMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	pool := make([]kv.SeqHash, 300)
	for i := range pool {
		pool[i] = kv.SeqHash(rng.Uint64()&^0x3ff) | kv.SeqHash((1020+rng.IntN(8))&0x3ff) // few homes, at the wrap
	}
	pool[0] = 0
	var s blockSet
	ref := map[kv.SeqHash]int32{}
	for step := 0; step < 200_000; step++ {
		h := pool[rng.IntN(len(pool))]
		if step%89 == 0 {
			s.warm(pool) // a read-only hint, from the empty set (step 0) on
		}
		if rng.IntN(2) == 0 {
			s.inc(h)
			ref[h]++
		} else {
			s.dec(h)
			if ref[h] > 1 {
				ref[h]--
			} else {
				delete(ref, h)
			}
		}
		if s.len() != len(ref) {
			t.Fatalf("step %d: len %d, want %d", step, s.len(), len(ref))
		}
		if step%97 == 0 {
			for _, k := range pool {
				if s.has(k) != (ref[k] > 0) {
					t.Fatalf("step %d: has(%x) = %v", step, k, s.has(k))
				}
			}
		}
	}
}
