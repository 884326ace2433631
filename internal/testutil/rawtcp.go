package testutil

import (
	"bytes"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/quantile"
)

// BenchVsRawTCP measures fetch, which must move total bytes over loopback,
// against the loopback TCP baseline: one request byte answered by total
// bytes written with a plain io.Copy. The two alternate in order, so neither
// always goes first. It reports raw_MB/s, fetch_MB/s, ratio (fetch over raw
// throughput), median_ratio (of the per-iteration ratios) and cpu_ratio (raw
// CPU over fetch CPU, both ends: everything runs in this process; steadier
// than wall time on a shared machine, and loopback TCP is CPU-bound, so it
// predicts the idle ratio); with KVMESH_BENCH_CPU set, also the user and
// system CPU per op of each side.
func BenchVsRawTCP(b *testing.B, total int, fetch func()) {
	addr, stop := rawTCPServer(b, total)
	defer stop()
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	rawBuf := make([]byte, total)
	var rawCPU, fetchCPU, rawSys, fetchSys time.Duration
	timed := func(cpu, sys *time.Duration, f func()) time.Duration {
		c0, s0 := processCPU()
		t0 := time.Now()
		f()
		d := time.Since(t0)
		c1, s1 := processCPU()
		*cpu += c1 - c0
		*sys += s1 - s0
		return d
	}
	doRaw := func() {
		if _, err := raw.Write([]byte{1}); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(raw, rawBuf); err != nil {
			b.Fatal(err)
		}
	}
	doRaw()
	fetch()
	var rawDur, fetchDur time.Duration
	ratios := make([]float64, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var rd, fd time.Duration
		if i%2 == 0 {
			rd, fd = timed(&rawCPU, &rawSys, doRaw), timed(&fetchCPU, &fetchSys, fetch)
		} else {
			fd, rd = timed(&fetchCPU, &fetchSys, fetch), timed(&rawCPU, &rawSys, doRaw)
		}
		rawDur += rd
		fetchDur += fd
		ratios = append(ratios, rd.Seconds()/fd.Seconds())
	}
	b.StopTimer()
	mb := float64(total) * float64(b.N) / 1e6
	slices.Sort(ratios)
	b.ReportMetric(mb/rawDur.Seconds(), "raw_MB/s")
	b.ReportMetric(mb/fetchDur.Seconds(), "fetch_MB/s")
	b.ReportMetric(rawDur.Seconds()/fetchDur.Seconds(), "ratio")
	b.ReportMetric(quantile.Nearest(ratios, 0.5), "median_ratio")
	b.ReportMetric(rawCPU.Seconds()/fetchCPU.Seconds(), "cpu_ratio")
	if os.Getenv("KVMESH_BENCH_CPU") != "" {
		n := float64(b.N)
		b.ReportMetric(float64(rawSys.Microseconds())/n, "raw_sys_us/op")
		b.ReportMetric(float64((rawCPU-rawSys).Microseconds())/n, "raw_user_us/op")
		b.ReportMetric(float64(fetchSys.Microseconds())/n, "fetch_sys_us/op")
		b.ReportMetric(float64((fetchCPU-fetchSys).Microseconds())/n, "fetch_user_us/op")
	}
}

// rawTCPServer answers every 1-byte request with size bytes.
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

// processCPU is this process's user+system and system CPU time.
func processCPU() (total, sys time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), time.Duration(ru.Stime.Nano())
}
