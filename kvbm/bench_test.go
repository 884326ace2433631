package kvbm

import (
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// Data-path benchmarks: each pairs kvbm's path with its baseline on the
// same bytes, as sub-benchmarks of one benchmark, so `-count` alternates
// them... see paired.
//
//	go test ./kvbm -run '^$' -bench 'Host|Disk' -benchtime 20x -count 3
//
// Each runs over a 16 MiB set of blocks (which a large last-level cache
// may hold) and a 256 MiB one (which none does: the host tier's real
// case, an arena of GBs whose blocks were offloaded long before).

var (
	benchBlockBytes = []int{64 << 10, 256 << 10}
	benchSetBytes   = []int{16 << 20, 256 << 20}
)

// offloadCases is benchCases for an offload, once hashing the device's
// bytes and once ("devsum") taking the checksums the device keeps.
func offloadCases(b *testing.B, run func(b *testing.B, blocks, bb int, raw *benchDevice, dev Device)) {
	for _, devsum := range []bool{false, true} {
		suffix := ""
		if devsum {
			suffix = "/devsum"
		}
		benchCases(b, suffix, func(b *testing.B, blocks, bb int) {
			raw := newBenchDevice(blocks, bb)
			var dev Device = raw
			if devsum {
				dev = withSums(raw)
			}
			run(b, blocks, bb, raw, dev)
		})
	}
}

// benchCases calls run for every block size and set size.
func benchCases(b *testing.B, suffix string, run func(b *testing.B, blocks, bb int)) {
	for _, bb := range benchBlockBytes {
		for _, set := range benchSetBytes {
			b.Run(fmt.Sprintf("%dKiB/%dMiB%s", bb>>10, set>>20, suffix), func(b *testing.B) { run(b, set/bb, bb) })
		}
	}
}

// benchDevice is a device of n random blocks.
type benchDevice struct{ blocks [][]byte }

func newBenchDevice(n, bb int) *benchDevice {
	d := &benchDevice{}
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < n; i++ {
		b := make([]byte, bb)
		for j := 0; j+8 <= bb; j += 8 {
			v := r.Uint64()
			b[j], b[j+1], b[j+2], b[j+3], b[j+4], b[j+5], b[j+6], b[j+7] =
				byte(v), byte(v>>8), byte(v>>16), byte(v>>24), byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56)
		}
		d.blocks = append(d.blocks, b)
	}
	return d
}

// sumDevice is a benchDevice that supplies its blocks' checksums, as the
// sim does when it keeps them.
type sumDevice struct {
	*benchDevice
	sums []uint64
}

func withSums(d *benchDevice) sumDevice {
	s := sumDevice{benchDevice: d}
	for _, b := range d.blocks {
		s.sums = append(s.sums, kv.Checksum(b))
	}
	return s
}

func (d sumDevice) BlockChecksum(id DeviceBlockID) (uint64, bool) { return d.sums[id], true }

func (d *benchDevice) ReadView(id DeviceBlockID) ([]byte, error)  { return d.blocks[id], nil }
func (d *benchDevice) WriteView(id DeviceBlockID) ([]byte, error) { return d.blocks[id], nil }

// storeBatch gives device block i the identity round·n + i, so every
// round offloads new blocks (evicting the previous round's).
func storeBatch(dst []StoreBlock, round, n int) []StoreBlock {
	dst = dst[:0]
	for i := 0; i < n; i++ {
		h := kv.SeqHash(uint64(round*n+i)*0x9E3779B97F4A7C15 + 1)
		dst = append(dst, StoreBlock{Device: DeviceBlockID(i), Meta: BlockMeta{Seq: h, Local: kv.LocalHash(h)}})
	}
	return dst
}

func newBenchManager(b *testing.B, blocks, bb int, host, disk bool) *Manager {
	cfg := Config{BlockSize: 16, BlockBytes: bb, DiskFilter: FilterConfig{Disabled: true}}
	if host {
		h, err := NewHostArena(blocks, bb)
		if err != nil {
			b.Fatal(err)
		}
		cfg.Host = h
	}
	if disk {
		d, err := OpenDiskFile(b.TempDir()+"/g3.pool", blocks, bb)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { d.Close() })
		cfg.Disk = d
	}
	m, err := NewManager(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return m
}

func ids(n int) []DeviceBlockID {
	out := make([]DeviceBlockID, n)
	for i := range out {
		out[i] = DeviceBlockID(i)
	}
	return out
}

// paired runs baseline and kvbm alternately, one round each per
// iteration, so both see the same machine (a shared one is noisy), and
// reports each one's GB/s and kvbm's throughput as a fraction of the
// baseline's ("x-of-base", the figure with a ≥ 0.8 target), by wall time
// and by the thread's CPU time ("cpu-x-of-base": on a loaded machine the
// wall ratio mostly measures when the scheduler ran each half).
func paired(b *testing.B, bytes int64, base, kvbm func()) {
	runtime.LockOSThread() // one thread: its CPU clock is the work's
	defer runtime.UnlockOSThread()
	base() // warm both (page cache, arena pages, maps)
	kvbm()
	var tb, tk, cb, ck time.Duration
	for b.Loop() {
		t0, c0 := time.Now(), threadCPU()
		base()
		t1, c1 := time.Now(), threadCPU()
		kvbm()
		tk += time.Since(t1)
		ck += threadCPU() - c1
		tb += t1.Sub(t0)
		cb += c1 - c0
	}
	n := float64(b.N)
	b.ReportMetric(float64(bytes)*n/tb.Seconds()/1e9, "base-GB/s")
	b.ReportMetric(float64(bytes)*n/tk.Seconds()/1e9, "kvbm-GB/s")
	b.ReportMetric(tb.Seconds()/tk.Seconds(), "x-of-base")
	if ck > 0 {
		b.ReportMetric(cb.Seconds()/ck.Seconds(), "cpu-x-of-base")
	}
}

// offloader offloads the device's blocks under new identities each round
// (so every round evicts the previous one's and writes).
func offloader(b *testing.B, m *Manager, dev Device, blocks int) func() {
	var batch []StoreBlock
	round := 0
	return func() {
		batch = storeBatch(batch, round, blocks)
		round++
		if n, err := m.Offload(dev, batch); err != nil || n != blocks {
			b.Fatalf("offload %d %v", n, err)
		}
	}
}

// onboarder offloads the device's blocks once, then each round matches
// and onboards them all back.
func onboarder(b *testing.B, m *Manager, dev Device, blocks int) func() {
	batch := storeBatch(nil, 0, blocks)
	if n, err := m.Offload(dev, batch); err != nil || n != blocks {
		b.Fatalf("offload %d %v", n, err)
	}
	seqs := seqsOfBlocks(batch)
	into := ids(blocks)
	var st []Staged
	return func() {
		st = m.Match(st[:0], seqs)
		if n, err := m.Onboard(dev, st, into); err != nil || n != blocks {
			b.Fatalf("onboard %d %v", n, err)
		}
	}
}

// BenchmarkHostOffload: device → host arena (checksum, evict, copy,
// register) against copy of the same bytes into an arena; "devsum" takes
// the checksums from the device.
func BenchmarkHostOffload(b *testing.B) {
	offloadCases(b, func(b *testing.B, blocks, bb int, raw *benchDevice, dev Device) {
		arena := make([]byte, blocks*bb)
		copyAll := func() {
			for i, src := range raw.blocks {
				copy(arena[i*bb:(i+1)*bb], src)
			}
		}
		paired(b, int64(blocks*bb), copyAll, offloader(b, newBenchManager(b, blocks, bb, true, false), dev, blocks))
	})
}

// BenchmarkHostOnboard: host arena → device (match, copy, verify) against
// copy of the same bytes out of an arena.
func BenchmarkHostOnboard(b *testing.B) {
	benchCases(b, "", func(b *testing.B, blocks, bb int) {
		dev := newBenchDevice(blocks, bb)
		arena := make([]byte, blocks*bb)
		for i, src := range dev.blocks {
			copy(arena[i*bb:(i+1)*bb], src) // real bytes, not the zero page
		}
		copyAll := func() {
			for i, dst := range dev.blocks {
				copy(dst, arena[i*bb:(i+1)*bb])
			}
		}
		paired(b, int64(blocks*bb), copyAll, onboarder(b, newBenchManager(b, blocks, bb, true, false), dev, blocks))
	})
}

// BenchmarkDiskOffload: device → disk pool file in bypass mode (checksum,
// payload pwrite, header pwrite) against WriteAt of the same bytes at the
// same offsets of a plain file.
func BenchmarkDiskOffload(b *testing.B) {
	offloadCases(b, func(b *testing.B, blocks, bb int, raw *benchDevice, dev Device) {
		f := benchFile(b, blocks, bb)
		writeAll := func() {
			for i, src := range raw.blocks {
				if _, err := f.WriteAt(src, int64(i*bb)); err != nil {
					b.Fatal(err)
				}
			}
		}
		paired(b, int64(blocks*bb), writeAll, offloader(b, newBenchManager(b, blocks, bb, false, true), dev, blocks))
	})
}

// BenchmarkDiskOnboard: disk pool file → device (match, pread, verify)
// against ReadAt of the same bytes from a plain file.
func BenchmarkDiskOnboard(b *testing.B) {
	benchCases(b, "", func(b *testing.B, blocks, bb int) {
		dev := newBenchDevice(blocks, bb)
		f := benchFile(b, blocks, bb)
		for i, src := range dev.blocks {
			if _, err := f.WriteAt(src, int64(i*bb)); err != nil {
				b.Fatal(err)
			}
		}
		readAll := func() {
			for i, dst := range dev.blocks {
				if _, err := f.ReadAt(dst, int64(i*bb)); err != nil {
					b.Fatal(err)
				}
			}
		}
		paired(b, int64(blocks*bb), readAll, onboarder(b, newBenchManager(b, blocks, bb, false, true), dev, blocks))
	})
}

func benchFile(b *testing.B, blocks, bb int) *os.File {
	f, err := os.Create(b.TempDir() + "/plain")
	if err != nil {
		b.Fatal(err)
	}
	if err := f.Truncate(int64(blocks * bb)); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	return f
}
