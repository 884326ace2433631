package sidecar

import (
	"fmt"
	"os"
	"testing"

	"github.com/kvmesh/kvmesh/internal/streamcopy"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/kvbm"
)

// BenchmarkStagingThroughHost is the sidecar's side of a step's blocks with
// each staging layout: stores (staging slot → host tier slot, then the
// checksum, as kvbm's offload does) and loads (host slot → staging slot,
// then the checksum of the host slot, as kvbm's onboard does), for 64
// vLLM-shaped 512 KiB blocks (8 layers' K and V: 16 pieces of 32 KiB).
// With pieces the block goes through the scratch block (readSlot /
// writeSlot): what the worker's faster copy costs here.
//
//	go test ./kvbm/sidecar -run '^$' -bench StagingThroughHost -count 3
func BenchmarkStagingThroughHost(b *testing.B) {
	const slots, piece, npieces = 64, 32 << 10, 16
	bb := piece * npieces
	dir := "/dev/shm"
	if _, err := os.Stat(dir); err != nil {
		dir = b.TempDir()
	}
	pieces := make([]int, npieces)
	for i := range pieces {
		pieces[i] = piece
	}
	for _, layout := range []string{"blocks", "pieces"} {
		b.Run(layout, func(b *testing.B) {
			var ps []int
			if layout == "pieces" {
				ps = pieces
			}
			a, err := createArena(dir, fmt.Sprintf("kvmesh-bench-%d-%s.arena", os.Getpid(), layout), bb, slots, slots, ps, DefaultStagingAlign)
			if err != nil {
				b.Fatal(err)
			}
			defer a.close()
			h, err := kvbm.NewHostArenaOver(a.host(), slots, bb)
			if err != nil {
				b.Fatal(err)
			}
			for i := range a.mem[arenaDataOff:] {
				a.mem[arenaDataOff+i] = byte(i * 7)
			}
			scratch := make([]byte, bb)
			var sum uint64
			b.Run("store", func(b *testing.B) {
				b.SetBytes(int64(slots * bb))
				for n := 0; n < b.N; n++ {
					for s := 0; s < slots; s++ {
						src := scratch
						if ps == nil {
							src = a.stagingSlot(s)
						} else {
							a.readSlot(s, scratch)
						}
						h.Put(s, src, kvbm.BlockMeta{})
						sum += kv.Checksum(src)
					}
				}
			})
			b.Run("load", func(b *testing.B) {
				b.SetBytes(int64(slots * bb))
				for n := 0; n < b.N; n++ {
					for s := 0; s < slots; s++ {
						dst := scratch
						if ps == nil {
							dst = a.stagingSlot(s)
						}
						streamcopy.Copy(dst, h.View(s))
						sum += kv.Checksum(h.View(s))
						if ps != nil {
							a.writeSlot(s, scratch)
						}
					}
				}
			})
			if sum == 1 {
				b.Log(sum)
			}
		})
	}
}
