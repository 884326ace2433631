package transfer

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// storedSource holds ready payloads and copies them out, like an engine
// reading its KV store; MemSource would regenerate bytes on every read and
// measure kv.FillPayload instead of the transfer.
type storedSource struct {
	blocks map[uint64][]byte
	sums   map[uint64]uint64
}

func (s *storedSource) BlockChecksum(h uint64) (uint64, bool) {
	sum, ok := s.sums[h]
	return sum, ok
}

func newStoredSource(hs []uint64, layers, layerSize int) *storedSource {
	s := &storedSource{blocks: make(map[uint64][]byte, len(hs)), sums: make(map[uint64]uint64, len(hs))}
	for _, h := range hs {
		b := make([]byte, layers*layerSize)
		for l := 0; l < layers; l++ {
			kv.FillPayload(b[l*layerSize:(l+1)*layerSize], kv.SeqHash(h), l)
		}
		s.blocks[h] = b
		s.sums[h] = kv.Checksum(b)
	}
	return s
}

func (s *storedSource) Pin(hs []uint64) (int, func()) {
	n := 0
	for _, h := range hs {
		if _, ok := s.blocks[h]; !ok {
			break
		}
		n++
	}
	return n, func() {}
}

func (s *storedSource) ReadBlock(h uint64, dst []byte) ([]byte, error) {
	b, ok := s.blocks[h]
	if !ok {
		return dst, fmt.Errorf("block %x not held", h)
	}
	return append(dst, b...), nil
}

// rawServer answers every 1-byte request with size bytes, written with a
// plain io.Copy: the loopback TCP baseline.
func rawServer(b *testing.B, size int) (addr string, stop func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	data := bytes.Repeat([]byte{0xA5}, size)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				var req [1]byte
				for {
					if _, err := io.ReadFull(c, req[:]); err != nil {
						return
					}
					if _, err := io.Copy(c, bytes.NewReader(data)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), func() { ln.Close(); wg.Wait() }
}

// BenchmarkTransferVsRaw fetches blocks×blockBytes over loopback and, in the
// same iterations, moves the same bytes with raw TCP (one request byte, one
// io.Copy of the whole payload, io.ReadFull into a preallocated buffer).
// It reports both throughputs, ratio = fetch/raw over all iterations and
// median_ratio over iteration pairs (robust to a noisy shared machine);
// target ≥ 0.8. The fetch includes framing, checksums and verification.
// Sub-benchmarks: copy (ReadBlock) or view (BlockViewer, writev) on the
// source; alloc (fresh receive memory per fetch), release (the result is
// Released after each fetch, so receive memory is recycled) or recvbuf (a
// reused FetchRequest.Buffer, like the raw side's preallocated buffer).
func BenchmarkTransferVsRaw(b *testing.B) {
	for _, sz := range []struct{ blocks, layers, layerSize int }{
		{256, 4, 16 << 10}, // 256 × 64 KiB = 16 MiB
		{64, 4, 256 << 10}, // 64 × 1 MiB = 64 MiB
	} {
		for _, mode := range []string{"copy/alloc", "copy/release", "copy/recvbuf", "view/alloc", "view/release", "view/recvbuf"} {
			name := fmt.Sprintf("%dx%dKiB/%s", sz.blocks, sz.layers*sz.layerSize>>10, mode)
			b.Run(name, func(b *testing.B) {
				view, recv, _ := strings.Cut(mode, "/")
				benchVsRaw(b, sz.blocks, sz.layers, sz.layerSize, view == "view", recv)
			})
		}
	}
}

func benchVsRaw(b *testing.B, blocks, layers, layerSize int, view bool, recv string) {
	blockBytes := layers * layerSize
	total := blocks * blockBytes
	hs := hashes(1000, blocks)
	var src BlockSource = newStoredSource(hs, layers, layerSize)
	if view {
		src = viewSource{src.(*storedSource)}
	}
	ep := startServer(b, &Server{Source: src})
	c := newClient(b, ClientOptions{Timeout: 30 * time.Second, MaxBlockBytes: blockBytes})
	rawAddr, stop := rawServer(b, total)
	defer stop()
	raw, err := net.Dial("tcp", rawAddr)
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	rawBuf := make([]byte, total)
	ctx := context.Background()
	req := FetchRequest{Hashes: hs}
	if recv == "recvbuf" {
		req.Buffer = make([]byte, blocks*(headerLen+blockMetaLen+blockBytes)+headerLen+maxStatusFrame)
	}
	var rawCPU, fetchCPU, rawSys, fetchSys time.Duration
	doRaw := func() time.Duration {
		c0, s0 := processCPU()
		defer func() { c1, s1 := processCPU(); rawCPU += c1 - c0; rawSys += s1 - s0 }()
		t0 := time.Now()
		if _, err := raw.Write([]byte{1}); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(raw, rawBuf); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	doFetch := func() time.Duration {
		c0, s0 := processCPU()
		defer func() { c1, s1 := processCPU(); fetchCPU += c1 - c0; fetchSys += s1 - s0 }()
		t0 := time.Now()
		res, err := c.Fetch(ctx, ep, req)
		if err != nil || res.Bytes != int64(total) {
			b.Fatalf("fetch: %v (%d bytes)", err, res.Bytes)
		}
		if recv == "release" {
			res.Release()
		}
		return time.Since(t0)
	}
	doRaw()
	doFetch()
	rawCPU, fetchCPU, rawSys, fetchSys = 0, 0, 0, 0
	var rawDur, fetchDur time.Duration
	ratios := make([]float64, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var rd, fd time.Duration
		if i%2 == 0 { // alternate the order so neither side always goes first
			rd, fd = doRaw(), doFetch()
		} else {
			fd, rd = doFetch(), doRaw()
		}
		rawDur += rd
		fetchDur += fd
		ratios = append(ratios, rd.Seconds()/fd.Seconds())
	}
	b.StopTimer()
	mb := float64(total) * float64(b.N) / 1e6
	rawMBs, fetchMBs := mb/rawDur.Seconds(), mb/fetchDur.Seconds()
	sort.Float64s(ratios)
	b.ReportMetric(rawMBs, "raw_MB/s")
	b.ReportMetric(fetchMBs, "fetch_MB/s")
	b.ReportMetric(fetchMBs/rawMBs, "ratio")
	b.ReportMetric(ratios[len(ratios)/2], "median_ratio")
	// CPU (user+sys, both ends: everything runs in this process) per byte
	// is steadier than wall time on a shared machine; loopback TCP is
	// CPU-bound, so cpu_ratio = raw CPU / fetch CPU predicts the idle ratio.
	b.ReportMetric(rawCPU.Seconds()/fetchCPU.Seconds(), "cpu_ratio")
	if os.Getenv("KVMESH_BENCH_CPU") != "" {
		n := float64(b.N)
		b.ReportMetric(float64(rawSys.Microseconds())/n, "raw_sys_us/op")
		b.ReportMetric(float64((rawCPU-rawSys).Microseconds())/n, "raw_user_us/op")
		b.ReportMetric(float64(fetchSys.Microseconds())/n, "fetch_sys_us/op")
		b.ReportMetric(float64((fetchCPU-fetchSys).Microseconds())/n, "fetch_user_us/op")
	}
}

// BenchmarkFetchSmall measures per-fetch overhead (4 blocks × 4 KiB) with a
// pooled connection against a fresh connection per fetch.
func BenchmarkFetchSmall(b *testing.B) {
	for _, pooled := range []bool{true, false} {
		name := "pooled"
		idle := 0
		if !pooled {
			name, idle = "dial_per_fetch", -1
		}
		b.Run(name, func(b *testing.B) {
			hs := hashes(2000, 4)
			ep := startServer(b, &Server{Source: newStoredSource(hs, 1, 4<<10)})
			c := newClient(b, ClientOptions{MaxIdlePerEndpoint: idle})
			ctx := context.Background()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := c.Fetch(ctx, ep, FetchRequest{Hashes: hs}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkVerify is the cost of the optional byte-for-byte Verify on top
// of the checksum, per 64 KiB block.
func BenchmarkVerify(b *testing.B) {
	const layers, layerSize = 4, 16 << 10
	p := newStoredSource([]uint64{7}, layers, layerSize).blocks[7]
	v := PayloadVerifier(layers, layerSize)
	b.SetBytes(int64(len(p)))
	b.Run("checksum", func(b *testing.B) {
		b.SetBytes(int64(len(p)))
		for i := 0; i < b.N; i++ {
			kv.Checksum(p)
		}
	})
	b.Run("payload", func(b *testing.B) {
		b.SetBytes(int64(len(p)))
		for i := 0; i < b.N; i++ {
			if err := v(7, p); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// viewSource serves the same stored payloads without copying (BlockViewer).
type viewSource struct{ *storedSource }

func (s viewSource) ViewBlock(h uint64) ([]byte, error) {
	b, ok := s.blocks[h]
	if !ok {
		return nil, fmt.Errorf("block %x not held", h)
	}
	return b, nil
}

// processCPU is this process's user+system and system CPU time.
func processCPU() (total, sys time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), time.Duration(ru.Stime.Nano())
}
