package index

import (
	"math/rand/v2"
	"testing"
)

// TestStampMapMatchesMap drives random sets, gets and deletes (small key
// space, so probe runs collide and deletions shift them) against a Go map.
func TestStampMapMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var m stampMap
	ref := map[uint64]uint64{}
	for i := 0; i < 200000; i++ {
		k := rng.Uint64N(3000)
		if rng.IntN(5) == 0 {
			k <<= 60 // keys sharing low bits, and key 0 itself
		}
		switch rng.IntN(3) {
		case 0:
			v := uint64(i + 1)
			_, had := ref[k]
			if m.set(k, v) == had {
				t.Fatalf("step %d: set(%d) new=%v, map had it=%v", i, k, !had, had)
			}
			ref[k] = v
		case 1:
			m.del(k)
			delete(ref, k)
		default:
			if got := m.get(k); got != ref[k] {
				t.Fatalf("step %d: get(%d) = %d, want %d", i, k, got, ref[k])
			}
		}
		if m.len() != len(ref) {
			t.Fatalf("step %d: len %d, want %d", i, m.len(), len(ref))
		}
	}
	for k, v := range ref {
		if m.get(k) != v {
			t.Fatalf("final get(%d) = %d, want %d", k, m.get(k), v)
		}
	}
}
