package sidecar

import (
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/streamcopy"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/kvbm"
)

// BenchmarkStagingLayouts is the sidecar's side of a step's blocks with
// each staging layout: stores (staging slot → host tier slot, then the
// checksum, as kvbm's offload does) and loads (host slot → staging slot,
// then the checksum of the host slot, as kvbm's onboard does), for 64
// vLLM-shaped 512 KiB blocks (8 layers' K and V: 16 pieces of 32 KiB).
// With pieces the sidecar copies each piece between the host slot and the
// staging slot (kvbm.PieceDevice), hashing a stored block piece by piece:
// what the worker's faster copy costs here. Each iteration runs the four in turn
// (the order rotating), so the reported ratios (pieces ÷ blocks, the
// median of the iterations' ratios) compare runs under the same load; the
// ms/op metrics are medians of one step's 64 blocks.
//
//	go test ./kvbm/sidecar -run '^$' -bench StagingLayouts -benchtime 60x -count 3
func BenchmarkStagingLayouts(b *testing.B) {
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
	type side struct {
		a *arena
		h *kvbm.HostArena
	}
	var sides [2]side // blocks, pieces
	for i := range sides {
		var ps []int
		if i == 1 {
			ps = pieces
		}
		a, err := createArena(dir, fmt.Sprintf("kvmesh-bench-%d-%d.arena", os.Getpid(), i), bb, slots, slots, ps, DefaultStagingAlign)
		if err != nil {
			b.Fatal(err)
		}
		defer a.close()
		h, err := kvbm.NewHostArenaOver(a.host(), slots, bb)
		if err != nil {
			b.Fatal(err)
		}
		for j := range a.mem[arenaDataOff:] {
			a.mem[arenaDataOff+j] = byte(j * 7)
		}
		sides[i] = side{a, h}
	}
	var sum uint64
	// As stagingDevice's ReadBlock and WriteBlock run them for kvbm.
	store := func(sd *side) {
		for s := 0; s < slots; s++ {
			if sd.a.pieces == nil {
				src := sd.a.stagingSlot(s)
				streamcopy.Copy(sd.h.View(s), src)
				sum += kv.Checksum(src)
			} else {
				sum += sd.a.readSlotHashed(s, sd.h.View(s))
			}
		}
	}
	load := func(sd *side) {
		for s := 0; s < slots; s++ {
			if sd.a.pieces == nil {
				streamcopy.Copy(sd.a.stagingSlot(s), sd.h.View(s))
			} else {
				sd.a.writeSlot(s, sd.h.View(s))
			}
			sum += kv.Checksum(sd.h.View(s))
		}
	}
	runs := []func(){func() { store(&sides[0]) }, func() { store(&sides[1]) }, func() { load(&sides[0]) }, func() { load(&sides[1]) }}
	times := make([][]float64, len(runs))
	b.SetBytes(int64(4 * slots * bb))
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		for k := range runs {
			i := (n + k) % len(runs)
			t0 := time.Now()
			runs[i]()
			times[i] = append(times[i], float64(time.Since(t0)))
		}
	}
	b.StopTimer()
	med := func(x []float64) float64 {
		y := slices.Clone(x)
		slices.Sort(y)
		return y[len(y)/2]
	}
	ratio := func(p, q []float64) float64 {
		r := make([]float64, len(p))
		for i := range p {
			r[i] = p[i] / q[i]
		}
		return med(r)
	}
	b.ReportMetric(med(times[0])/1e6, "blocks-store-ms")
	b.ReportMetric(med(times[1])/1e6, "pieces-store-ms")
	b.ReportMetric(med(times[2])/1e6, "blocks-load-ms")
	b.ReportMetric(med(times[3])/1e6, "pieces-load-ms")
	b.ReportMetric(ratio(times[1], times[0]), "store-ratio")
	b.ReportMetric(ratio(times[3], times[2]), "load-ratio")
	if sum == 1 {
		b.Log(sum)
	}
}
