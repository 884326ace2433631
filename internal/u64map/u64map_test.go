package u64map

import (
	"math/rand/v2"
	"testing"
)

// Random sets and deletes against a Go map: presized maps at full load,
// maps grown from zero, clustered small keys, keys sharing low bits, and
// the key 0.
func TestMatchesGoMap(t *testing.T) {
	for _, capacity := range []int{0, 1, 5, 64, 1000} {
		r := rand.New(rand.NewPCG(uint64(capacity), 3))
		var m Map[uint64, int32]
		if capacity > 0 {
			m = New[uint64, int32](capacity)
		}
		limit := capacity
		if limit == 0 {
			limit = 3000 // grown from empty
		}
		ref := map[uint64]int32{}
		keys := make([]uint64, 0, 4*limit)
		for i := 0; i < 4*limit; i++ {
			switch i % 3 {
			case 0:
				keys = append(keys, uint64(i)) // small, clustered keys (and 0)
			case 1:
				keys = append(keys, uint64(i)<<52) // equal low bits
			default:
				keys = append(keys, r.Uint64())
			}
		}
		for op := 0; op < 20000; op++ {
			k := keys[r.IntN(len(keys))]
			if len(ref) < limit && r.IntN(2) == 0 {
				v := int32(r.IntN(1 << 20))
				_, had := ref[k]
				if m.Set(k, v) == had {
					t.Fatalf("cap %d op %d: Set(%d) new=%v, map had it=%v", capacity, op, k, !had, had)
				}
				ref[k] = v
			} else {
				m.Delete(k)
				delete(ref, k)
			}
			if m.Len() != len(ref) {
				t.Fatalf("cap %d op %d: len %d, map %d", capacity, op, m.Len(), len(ref))
			}
			if op%97 == 0 {
				for _, k := range keys {
					v, ok := m.Get(k)
					want, wok := ref[k]
					if ok != wok || v != want {
						t.Fatalf("cap %d op %d: Get(%d) = %d %v, map %d %v", capacity, op, k, v, ok, want, wok)
					}
				}
			}
		}
		if capacity > 0 && len(m.slots) != len(New[uint64, int32](capacity).slots) {
			t.Fatalf("cap %d: a presized map grew to %d slots", capacity, len(m.slots))
		}
	}
}

func TestZeroMap(t *testing.T) {
	var m Map[uint64, uint64]
	if v, ok := m.Get(7); ok || v != 0 {
		t.Fatal("empty map has 7")
	}
	m.Delete(7)
	m.Delete(0)
	if m.Len() != 0 {
		t.Fatal(m.Len())
	}
	if m.Touch(7) != 0 {
		t.Fatal("touching an empty map read a key")
	}
}

// Touch reads a key's home slot: the key itself when it sits there (a lone
// key does), else what occupies it.
func TestTouch(t *testing.T) {
	m := New[uint64, int32](8)
	m.Set(12345, 1)
	if got := m.Touch(12345); got != 12345 {
		t.Fatalf("Touch of the lone key = %d", got)
	}
	m.Delete(12345)
	if got := m.Touch(12345); got != 0 {
		t.Fatalf("Touch after its delete = %d", got)
	}
}

func TestNoAllocs(t *testing.T) {
	m := New[uint64, int32](1024)
	k := uint64(1)
	if n := testing.AllocsPerRun(1000, func() {
		k = k*6364136223846793005 + 1
		m.Set(k, 1)
		m.Get(k)
		m.Delete(k)
	}); n != 0 {
		t.Fatalf("%v allocs", n)
	}
}

// The sim's block table: a full table under evict-and-insert churn.
func BenchmarkChurn(b *testing.B) {
	h := New[uint64, int32](16384)
	r := rand.New(rand.NewPCG(1, 2))
	ring := make([]uint64, 16384)
	for i := range ring {
		ring[i] = r.Uint64()
		h.Set(ring[i], int32(i))
	}
	i := 0
	for b.Loop() {
		h.Delete(ring[i])
		ring[i] = r.Uint64()
		h.Set(ring[i], int32(i))
		h.Get(ring[(i*7)%len(ring)])
		i = (i + 1) % len(ring)
	}
}
