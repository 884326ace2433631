package mix

import "testing"

// The reference splitmix64 stream seeded with 0 (Vigna's splitmix64.c).
func TestNextMatchesReference(t *testing.T) {
	want := []uint64{0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f}
	var x uint64
	for i, w := range want {
		if got := Next(&x); got != w {
			t.Fatalf("value %d = %#x, want %#x", i, got, w)
		}
	}
}

func TestMix64Bijective(t *testing.T) {
	seen := map[uint64]uint64{}
	for i := uint64(0); i < 1<<16; i++ {
		z := Mix64(i)
		if j, ok := seen[z]; ok {
			t.Fatalf("Mix64(%d) = Mix64(%d)", i, j)
		}
		seen[z] = i
	}
}
