package bench

import (
	"context"
	"os"
	"runtime"
	"testing"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/internal/cputime"
)

// BenchmarkReplay7000 replays the 7,000-worker timeline of the
// conversation trace against one Index on one thread (what bench index's
// 1-thread row times), reporting thread CPU per replay: for profiles
// (-cpuprofile) and alternated before/after runs.
func BenchmarkReplay7000(b *testing.B) {
	ops := timeline7000(b)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var cpu int64
	for b.Loop() {
		r := &ixRunner{ix: index.New()}
		c0 := cputime.Thread()
		for i := range ops {
			if o := &ops[i]; o.find != nil {
				r.find(o.find)
			} else {
				r.apply(o.event)
			}
		}
		cpu += int64(cputime.Thread() - c0)
	}
	b.ReportMetric(float64(cpu)/float64(b.N)/1e6, "cpu-ms/replay")
}

// BenchmarkShardWriters7000 applies the 7,000-worker timeline's events to
// a 2-shard index.Sharded, each shard's events in turn on one thread and
// no finds: the work of the parallel row's event groups, in thread CPU
// per replay (both shards), for profiles and alternated runs of the
// write path.
func BenchmarkShardWriters7000(b *testing.B) {
	ops := timeline7000(b)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var cpu, sys, faults int64
	for b.Loop() {
		ix := index.NewSharded(2, index.Config{})
		c0 := cputime.Thread()
		s0, f0 := cputime.ThreadFaults()
		for g := range ix.Shards() {
			for i := range ops {
				if o := &ops[i]; o.find == nil && ix.ShardOf(o.event.Worker) == g {
					ix.Apply(o.event)
				}
			}
		}
		cpu += int64(cputime.Thread() - c0)
		s1, f1 := cputime.ThreadFaults()
		sys += int64(s1 - s0)
		faults += f1 - f0
	}
	b.ReportMetric(float64(cpu)/float64(b.N)/1e6, "cpu-ms/replay")
	b.ReportMetric(float64(sys)/float64(b.N)/1e6, "sys-ms/replay")
	b.ReportMetric(float64(faults)/float64(b.N), "faults/replay")
}

// timeline7000 is the conversation trace's timeline spread over 7,000
// workers, as bench index --workers 7000 builds it.
func timeline7000(b *testing.B) []op {
	b.Helper()
	if _, err := os.Stat(tracePath); err != nil {
		b.Skip("trace not present")
	}
	c := IndexConfig{TracePath: tracePath, Workers: 7000}
	c.defaults()
	var res IndexResult
	ops, err := buildTimeline(context.Background(), c, &res)
	if err != nil {
		b.Fatal(err)
	}
	return ops
}
