package streamcopy

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

func TestCopy(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	// Every length class around minStream and the 128-byte stride, at
	// destination and source offsets that cover each alignment case.
	for _, n := range []int{0, 1, 127, minStream - 1, minStream, minStream + 1, minStream + 127, 64 << 10, 64<<10 + 33, 256 << 10} {
		for _, dOff := range []int{0, 1, 31, 32, 63} {
			for _, sOff := range []int{0, 5, 32} {
				dst := make([]byte, n+dOff+64)
				for i := range dst {
					dst[i] = 0xAA
				}
				src := buf[sOff : sOff+n]
				if got := Copy(dst[dOff:dOff+n], src); got != n {
					t.Fatalf("n=%d dOff=%d sOff=%d: copied %d", n, dOff, sOff, got)
				}
				if !bytes.Equal(dst[dOff:dOff+n], src) {
					t.Fatalf("n=%d dOff=%d sOff=%d: bytes differ", n, dOff, sOff)
				}
				for i, c := range append(dst[:dOff:dOff], dst[dOff+n:]...) {
					if c != 0xAA {
						t.Fatalf("n=%d dOff=%d sOff=%d: byte %d outside the copy changed", n, dOff, sOff, i)
					}
				}
			}
		}
	}
}

func TestCopyShorterSide(t *testing.T) {
	src := bytes.Repeat([]byte{7}, 3*minStream)
	dst := make([]byte, 2*minStream)
	if n := Copy(dst, src); n != len(dst) || !bytes.Equal(dst, src[:len(dst)]) {
		t.Fatalf("short dst: %d", n)
	}
	dst = make([]byte, 4*minStream)
	if n := Copy(dst, src); n != len(src) || !bytes.Equal(dst[:n], src) || dst[n] != 0 {
		t.Fatalf("short src: %d", n)
	}
}

// Overlapping slices take copy's memmove semantics, not a forward stream
// that would read bytes it already overwrote.
func TestCopyOverlap(t *testing.T) {
	for _, shift := range []int{-4096, -1, 1, 200, 4096} {
		buf := make([]byte, 64<<10)
		for i := range buf {
			buf[i] = byte(i * 13)
		}
		want := append([]byte(nil), buf...)
		n := 32 << 10
		s, d := 16<<10, 16<<10+shift
		copy(want[d:d+n], want[s:s+n])
		Copy(buf[d:d+n], buf[s:s+n])
		if !bytes.Equal(buf, want) {
			t.Fatalf("shift %d: overlapping copy differs from copy", shift)
		}
	}
}

// BenchmarkCopy: Copy against copy of the same blocks into a 256 MiB
// arena, as the host tier writes it (cold source and destination).
//
//	go test ./internal/streamcopy -run '^$' -bench Copy -count 3
func BenchmarkCopy(b *testing.B) {
	const set = 256 << 20
	src, dst := make([]byte, set), make([]byte, set)
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src) // fault the pages in before timing
	for _, bb := range []int{64 << 10, 256 << 10} {
		for _, c := range []struct {
			name string
			copy func(dst, src []byte) int
		}{{"copy", func(d, s []byte) int { return copy(d, s) }}, {"streamcopy", Copy}} {
			b.Run(fmt.Sprintf("%dKiB/%s", bb>>10, c.name), func(b *testing.B) {
				b.SetBytes(set)
				for b.Loop() {
					for off := 0; off < set; off += bb {
						c.copy(dst[off:off+bb], src[off:off+bb])
					}
				}
			})
		}
	}
}
