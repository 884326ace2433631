package sim

import (
	"math/rand/v2"
	"testing"
)

// TestHashIndexAgainstMap runs random puts and deletes (with clustered
// keys, key 0, and a full-capacity load) against a Go map.
func TestHashIndexAgainstMap(t *testing.T) {
	for _, capacity := range []int{1, 5, 64, 1000} {
		r := rand.New(rand.NewPCG(uint64(capacity), 3))
		h := newHashIndex(capacity)
		ref := map[uint64]int32{}
		keys := make([]uint64, 0, 4*capacity)
		for i := 0; i < 4*capacity; i++ {
			if i%3 == 0 {
				keys = append(keys, uint64(i)) // small, clustered keys (and 0)
			} else {
				keys = append(keys, r.Uint64())
			}
		}
		for op := 0; op < 20000; op++ {
			k := keys[r.IntN(len(keys))]
			if len(ref) < capacity && r.IntN(2) == 0 {
				id := int32(r.IntN(1 << 20))
				h.put(k, id)
				ref[k] = id
			} else {
				h.del(k)
				delete(ref, k)
			}
			if h.len() != len(ref) {
				t.Fatalf("cap %d op %d: len %d, map %d", capacity, op, h.len(), len(ref))
			}
			if op%97 == 0 {
				for _, k := range keys {
					id, ok := h.get(k)
					want, wok := ref[k]
					if ok != wok || (ok && id != want) {
						t.Fatalf("cap %d op %d: get(%d) = %d %v, map %d %v", capacity, op, k, id, ok, want, wok)
					}
				}
			}
		}
	}
}

func BenchmarkHashIndexChurn(b *testing.B) {
	h := newHashIndex(16384)
	r := rand.New(rand.NewPCG(1, 2))
	ring := make([]uint64, 16384)
	for i := range ring {
		ring[i] = r.Uint64()
		h.put(ring[i], int32(i))
	}
	i := 0
	for b.Loop() {
		h.del(ring[i])
		ring[i] = r.Uint64()
		h.put(ring[i], int32(i))
		h.get(ring[(i*7)%len(ring)])
		i = (i + 1) % len(ring)
	}
}
