package worker

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/transfer"
)

// copySource hides SimSource's BlockViewer and BlockChecksummer: the
// server then copies each block out layer by layer under the engine's lock
// and hashes it, as SimSource did before it served views.
type copySource struct{ transfer.BlockSource }

// copySumSource copies but sends the stored checksums.
type copySumSource struct {
	transfer.BlockSource
	sums transfer.BlockChecksummer
}

func (s copySumSource) BlockChecksum(h uint64) (uint64, bool) { return s.sums.BlockChecksum(h) }

// BenchmarkSimSourceVsRaw fetches 256 cached blocks of 2 layers × 32 KiB
// (16 MiB) from a running sim engine through SimSource, a transfer.Server
// and a transfer.Client over loopback, and in the same iterations (order
// alternating) moves the same bytes with raw TCP: one request byte, one
// io.Copy of the whole payload, io.ReadFull into a preallocated buffer.
// median_ratio (fetch/raw throughput, median over iteration pairs) is the
// figure to hold against the 0.8 target; cpu_ratio (raw CPU / fetch CPU,
// both ends in this process) is steadier on a shared machine. The fetch
// verifies every block's checksum (not every byte: Peer adds that).
//
// Sources: view is SimSource as served (writev straight from the sim's
// slab, checksums stored at insert); copy is the old path (ReadBlock,
// server hashes each block); copysum copies but uses the stored checksums.
// Receive: recvbuf reuses one FetchRequest.Buffer, as the raw side reuses
// its buffer; release recycles the client's chunks with Release.
func BenchmarkSimSourceVsRaw(b *testing.B) {
	const blocks, layers, layerSize = 256, 2, 32 << 10
	cfg := sim.DefaultConfig()
	cfg.Model, cfg.BlockSize, cfg.Blocks, cfg.SpeedupRatio = "bench", 16, 2*blocks, 0
	cfg.Layers, cfg.PayloadSize, cfg.StoreChecksums = layers, layerSize, true
	e, err := sim.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	seqs := cachePrompt(b, context.Background(), e, tokens(blocks*cfg.BlockSize+1, 1))
	if n := e.Lookup(seqs); n != blocks {
		b.Fatalf("%d of %d blocks cached", n, blocks)
	}
	sim := NewSimSource(e)
	for _, src := range []struct {
		name string
		src  transfer.BlockSource
	}{{"view", sim}, {"copy", copySource{sim}}, {"copysum", copySumSource{copySource{sim}, sim}}} {
		for _, recv := range []string{"recvbuf", "release"} {
			b.Run(fmt.Sprintf("%dx%dKiB/%s/%s", blocks, layers*layerSize>>10, src.name, recv), func(b *testing.B) {
				benchSourceVsRaw(b, src.src, kv.RawHashes(seqs), layers*layerSize, recv == "recvbuf")
			})
		}
	}
}

func benchSourceVsRaw(b *testing.B, src transfer.BlockSource, hs []uint64, blockBytes int, recvbuf bool) {
	total := len(hs) * blockBytes
	ep := serveSource(b, src, "")
	c := transfer.NewClient(transfer.ClientOptions{Timeout: 30 * time.Second, MaxBlockBytes: blockBytes})
	defer c.Close()
	rawAddr, stop := rawTCPServer(b, total)
	defer stop()
	raw, err := net.Dial("tcp", rawAddr)
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	rawBuf := make([]byte, total)
	req := transfer.FetchRequest{Hashes: hs}
	if recvbuf {
		// 12-byte header + 20-byte block meta per block, then a done frame.
		req.Buffer = make([]byte, len(hs)*(32+blockBytes)+1044)
	}
	ctx := context.Background()
	var rawCPU, fetchCPU time.Duration
	doRaw := func() time.Duration {
		c0 := cpuNow()
		defer func() { rawCPU += cpuNow() - c0 }()
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
		c0 := cpuNow()
		defer func() { fetchCPU += cpuNow() - c0 }()
		t0 := time.Now()
		res, err := c.Fetch(ctx, ep, req)
		if err != nil || res.Outcome != transfer.OutcomeSuccess || res.Bytes != int64(total) {
			b.Fatalf("fetch: %v, %s, %d bytes", err, res.Outcome, res.Bytes)
		}
		if !recvbuf {
			res.Release()
		}
		return time.Since(t0)
	}
	doRaw()
	doFetch()
	rawCPU, fetchCPU = 0, 0
	var rawDur, fetchDur time.Duration
	ratios := make([]float64, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var rd, fd time.Duration
		if i%2 == 0 {
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
	sort.Float64s(ratios)
	b.ReportMetric(mb/rawDur.Seconds(), "raw_MB/s")
	b.ReportMetric(mb/fetchDur.Seconds(), "fetch_MB/s")
	b.ReportMetric(rawDur.Seconds()/fetchDur.Seconds(), "ratio")
	b.ReportMetric(ratios[len(ratios)/2], "median_ratio")
	b.ReportMetric(rawCPU.Seconds()/fetchCPU.Seconds(), "cpu_ratio")
}

// rawTCPServer answers every 1-byte request with size bytes (io.Copy): the
// loopback TCP baseline.
func rawTCPServer(b *testing.B, size int) (addr string, stop func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	data := bytes.Repeat([]byte{0xA5}, size)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
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
			})
		}
	})
	return ln.Addr().String(), func() { ln.Close(); wg.Wait() }
}

// cpuNow is this process's user+system CPU time.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
