package bench

import (
	"bytes"
	"context"
	"math"
	"os"
	"reflect"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/index/ref"
	"github.com/kvmesh/kvmesh/kv"
)

const tracePath = "../../shared/traces/conversation_trace.jsonl"

func TestBenchIndexSmallSlice(t *testing.T) {
	if _, err := os.Stat(tracePath); err != nil {
		t.Skip("trace not present")
	}
	var out bytes.Buffer
	res, err := RunIndex(context.Background(), IndexConfig{TracePath: tracePath, MaxLines: 500, Workers: 16, CacheBlocks: 2048}, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	last := lines[len(lines)-1]
	if !regexp.MustCompile(`^index: \d+ ops/s, find p99 \d+\.\d+ µs, \d+\.\d B/holding, \d+\.\dx vs reference$`).MatchString(last) {
		t.Fatalf("last line %q", last)
	}
	if !regexp.MustCompile(`(?m)^parallel row, thread CPU ms: event groups \d+\.\d(, \d+\.\d)*; readers \d+\.\d(, \d+\.\d)*$`).MatchString(out.String()) {
		t.Fatalf("no per-thread CPU line:\n%s", out.String())
	}
	if res.Requests != 500 || res.Finds != 500 || res.RemovedBlocks == 0 || !res.Verified || len(res.Phases) != 3 {
		t.Fatalf("result %+v", res)
	}
	if p := res.Phases[0]; p.BlockOps != res.StoredBlocks+res.RemovedBlocks+res.QueryBlocks || p.BlockOps <= p.Ops || p.BlockOpsPerS <= p.OpsPerSec {
		t.Fatalf("block ops %d (%.0f/s) vs ops %d (%.0f/s)", p.BlockOps, p.BlockOpsPerS, p.Ops, p.OpsPerSec)
	}
	// Holdings equal the reference, worker by worker, through the dump.
	for _, w := range res.Ref.Workers() {
		fresh := ref.New()
		for _, ev := range res.Index.Dump(w) {
			fresh.Apply(ev)
		}
		if !reflect.DeepEqual(fresh.Holdings(w), res.Ref.Holdings(w)) {
			t.Fatalf("worker %v holdings differ from the reference", w)
		}
	}
	if _, err := RunIndex(context.Background(), IndexConfig{TracePath: "/nonexistent"}, &out); err == nil {
		t.Fatal("missing trace must fail")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := RunIndex(ctx, IndexConfig{TracePath: tracePath, MaxLines: 50}, &out); err == nil {
		t.Fatal("cancelled context must stop the bench")
	}
}

func TestBenchIndexColdQuery(t *testing.T) {
	if _, err := os.Stat(tracePath); err != nil {
		t.Skip("trace not present")
	}
	for _, cold := range []bool{false, true} {
		var out bytes.Buffer
		res, err := RunIndex(context.Background(), IndexConfig{TracePath: tracePath, MaxLines: 200, Workers: 8, CacheBlocks: 1024, ColdQuery: cold}, &out)
		if err != nil || !res.Verified || res.Phases[0].FindsMeasured != res.Finds || res.Phases[1].FindsMeasured != res.Finds {
			t.Fatalf("cold %v: %v %+v\n%s", cold, err, res, out.String())
		}
		if got := strings.Contains(out.String(), "(--cold-query)"); got != cold {
			t.Fatalf("cold %v: output does not say how finds were timed:\n%s", cold, out.String())
		}
	}
	warmQuery([]kv.LocalHash{1, 6, 0x30})
	if querySink.Load() != 0x37 {
		t.Fatalf("warmQuery read %#x, want 0x37", querySink.Load())
	}
}

func TestLRUEvictsLeastRecent(t *testing.T) {
	l := newLRU(2)
	l.insert(1)
	l.insert(2)
	l.touch(1)
	if ev, did := l.insert(3); !did || ev != 2 {
		t.Fatalf("evicted %d %v, want 2", ev, did)
	}
	if _, ok := l.pos[1]; !ok {
		t.Fatal("1 must stay")
	}
}

func TestBenchIndexOfferedRates(t *testing.T) {
	if _, err := os.Stat(tracePath); err != nil {
		t.Skip("trace not present")
	}
	var out bytes.Buffer
	c := IndexConfig{TracePath: tracePath, MaxLines: 400, Workers: 700, CacheBlocks: 1024, EventGroups: 3, FindThreads: 2, OfferedRates: []float64{2000, 1e6}}
	res, err := RunIndex(context.Background(), c, &out)
	if err != nil || !res.Verified {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if len(res.Offered) != 2 || res.Phases[1].Threads != 3+1 || runtime.GOOS == "linux" && (res.Phases[0].CPU <= 0 || res.Phases[1].CPU <= 0) {
		t.Fatalf("offered %+v, parallel phase %+v", res.Offered, res.Phases[1])
	}
	line := regexp.MustCompile(`(?m)^offered (\d+) ops/s: achieved \d+ ops/s, find p50 \d+\.\d µs, p99 \d+\.\d µs$`)
	got := line.FindAllStringSubmatch(out.String(), -1)
	if len(got) != 2 || got[0][1] != "2000" || got[1][1] != "1000000" {
		t.Fatalf("rate lines %q in\n%s", got, out.String())
	}
	// At 2,000 ops/s the ~800 ops are due over ~0.4 s: the replay cannot
	// end before its last op is due, nor run far past it on any machine.
	if r := res.Offered[0]; r.Ops != res.Finds+res.Events || r.Wall < time.Duration(float64(r.Ops)/2000*0.95*float64(time.Second)) || r.FindP99 <= 0 || r.Achieved > 2000*1.06 {
		t.Fatalf("offered run %+v", r)
	}
	// The parts of the latency: a find cannot take less than itself, and
	// the tail's parts add up to at most the largest latency.
	for _, r := range res.Offered {
		if w := r.Why; w.ServiceP50 <= 0 || w.ServiceP50 > r.FindP50 || w.ServiceP99 < w.ServiceP50 || w.TailService <= 0 || w.ApplyMax <= 0 || runtime.GOOS == "linux" && w.CPU <= 0 {
			t.Fatalf("offered run's parts %+v", r)
		}
	}
	if n := strings.Count(out.String(), "  finds: queued for a free finder"); n != 2 || strings.Count(out.String(), "; process CPU ") != 2 {
		t.Fatalf("%d lines of latency parts in\n%s", n, out.String())
	}
	for _, bad := range [][]float64{{0}, {-5}, {math.NaN()}, {math.Inf(1)}} {
		c := IndexConfig{TracePath: tracePath, MaxLines: 10, OfferedRates: bad}
		if _, err := RunIndex(context.Background(), c, &out); err == nil || !strings.Contains(err.Error(), "--offered-rates") {
			t.Fatalf("rate %v: %v", bad, err)
		}
	}
}

func TestScheduleRescalesTheTimeline(t *testing.T) {
	ops := []op{{at: 1000}, {at: 1000}, {at: 3000}, {at: 5000}}
	s := schedule(ops, 2) // 4 ops at 2 ops/s: due over 2 s
	want := []time.Duration{0, 0, time.Second, 2 * time.Second}
	for i := range s {
		if s[i].due != want[i] || s[i].op != &ops[i] {
			t.Fatalf("op %d due %v, want %v", i, s[i].due, want[i])
		}
	}
}

func TestCriticalCPU(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		cpu   []time.Duration
		procs int
		want  time.Duration
	}{
		{[]time.Duration{5 * ms, 3 * ms}, 2, 5 * ms},          // the longest thread
		{[]time.Duration{4 * ms, 4 * ms, 4 * ms}, 2, 6 * ms},  // three threads on two cores
		{[]time.Duration{4 * ms, 4 * ms, 4 * ms}, 0, 12 * ms}, // no cores reads as one
	} {
		if got := criticalCPU(c.cpu, c.procs); got != c.want {
			t.Fatalf("criticalCPU(%v, %d) = %v, want %v", c.cpu, c.procs, got, c.want)
		}
	}
}
