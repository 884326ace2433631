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

const (
	benchBlocks = 256 // 256 × 256 KiB = 64 MiB: well past the caches
)

var benchBlockBytes = []int{64 << 10, 256 << 10}

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

func newBenchManager(b *testing.B, bb int, host, disk bool) *Manager {
	cfg := Config{BlockSize: 16, BlockBytes: bb, DiskFilter: FilterConfig{Disabled: true}}
	if host {
		h, err := NewHostArena(benchBlocks, bb)
		if err != nil {
			b.Fatal(err)
		}
		cfg.Host = h
	}
	if disk {
		d, err := OpenDiskFile(b.TempDir()+"/g3.pool", benchBlocks, bb)
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
func offloader(b *testing.B, m *Manager, dev Device) func() {
	var batch []StoreBlock
	round := 0
	return func() {
		batch = storeBatch(batch, round, benchBlocks)
		round++
		if n, err := m.Offload(dev, batch); err != nil || n != benchBlocks {
			b.Fatalf("offload %d %v", n, err)
		}
	}
}

// onboarder offloads the device's blocks once, then each round matches
// and onboards them all back.
func onboarder(b *testing.B, m *Manager, dev Device) func() {
	batch := storeBatch(nil, 0, benchBlocks)
	if n, err := m.Offload(dev, batch); err != nil || n != benchBlocks {
		b.Fatalf("offload %d %v", n, err)
	}
	seqs := seqsOfBlocks(batch)
	into := ids(benchBlocks)
	var st []Staged
	return func() {
		st = m.Match(st[:0], seqs)
		if n, err := m.Onboard(dev, st, into); err != nil || n != benchBlocks {
			b.Fatalf("onboard %d %v", n, err)
		}
	}
}

// BenchmarkHostOffload: device → host arena (checksum, evict, copy,
// register) against copy of the same bytes into an arena; "devsum" takes
// the checksums from the device.
func BenchmarkHostOffload(b *testing.B) {
	for _, bb := range benchBlockBytes {
		for _, devsum := range []bool{false, true} {
			name := fmt.Sprintf("%dKiB", bb>>10)
			if devsum {
				name += "/devsum"
			}
			b.Run(name, func(b *testing.B) {
				raw := newBenchDevice(benchBlocks, bb)
				var dev Device = raw
				if devsum {
					dev = withSums(raw)
				}
				arena := make([]byte, benchBlocks*bb)
				copyAll := func() {
					for i, src := range raw.blocks {
						copy(arena[i*bb:(i+1)*bb], src)
					}
				}
				paired(b, int64(benchBlocks*bb), copyAll, offloader(b, newBenchManager(b, bb, true, false), dev))
			})
		}
	}
}

// BenchmarkHostOnboard: host arena → device (match, copy, verify) against
// copy of the same bytes out of an arena.
func BenchmarkHostOnboard(b *testing.B) {
	for _, bb := range benchBlockBytes {
		b.Run(fmt.Sprintf("%dKiB", bb>>10), func(b *testing.B) {
			dev := newBenchDevice(benchBlocks, bb)
			arena := make([]byte, benchBlocks*bb)
			for i, src := range dev.blocks {
				copy(arena[i*bb:(i+1)*bb], src) // real bytes, not the zero page
			}
			copyAll := func() {
				for i, dst := range dev.blocks {
					copy(dst, arena[i*bb:(i+1)*bb])
				}
			}
			paired(b, int64(benchBlocks*bb), copyAll, onboarder(b, newBenchManager(b, bb, true, false), dev))
		})
	}
}

// BenchmarkDiskOffload: device → disk pool file in bypass mode (checksum,
// payload pwrite, header pwrite) against WriteAt of the same bytes at the
// same offsets of a plain file.
func BenchmarkDiskOffload(b *testing.B) {
	for _, bb := range benchBlockBytes {
		for _, devsum := range []bool{false, true} {
			name := fmt.Sprintf("%dKiB", bb>>10)
			if devsum {
				name += "/devsum"
			}
			b.Run(name, func(b *testing.B) {
				raw := newBenchDevice(benchBlocks, bb)
				var dev Device = raw
				if devsum {
					dev = withSums(raw)
				}
				f := benchFile(b, bb)
				writeAll := func() {
					for i, src := range raw.blocks {
						if _, err := f.WriteAt(src, int64(i*bb)); err != nil {
							b.Fatal(err)
						}
					}
				}
				paired(b, int64(benchBlocks*bb), writeAll, offloader(b, newBenchManager(b, bb, false, true), dev))
			})
		}
	}
}

// BenchmarkDiskOnboard: disk pool file → device (match, pread, verify)
// against ReadAt of the same bytes from a plain file.
func BenchmarkDiskOnboard(b *testing.B) {
	for _, bb := range benchBlockBytes {
		b.Run(fmt.Sprintf("%dKiB", bb>>10), func(b *testing.B) {
			dev := newBenchDevice(benchBlocks, bb)
			f := benchFile(b, bb)
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
			paired(b, int64(benchBlocks*bb), readAll, onboarder(b, newBenchManager(b, bb, false, true), dev))
		})
	}
}

func benchFile(b *testing.B, bb int) *os.File {
	f, err := os.Create(b.TempDir() + "/plain")
	if err != nil {
		b.Fatal(err)
	}
	if err := f.Truncate(int64(benchBlocks * bb)); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	return f
}
