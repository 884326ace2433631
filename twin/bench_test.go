package twin

import (
	"context"
	"os"
	"runtime"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/internal/cputime"
	"github.com/kvmesh/kvmesh/router"
)

// conversationTrace is $KVMESH_TRACE, else the shared traces folder next
// to the repository (../shared/traces from its root).
func conversationTrace() string {
	if p := os.Getenv("KVMESH_TRACE"); p != "" {
		return p
	}
	for _, p := range []string{"../../shared/traces/conversation_trace.jsonl", "/work/shared/traces/conversation_trace.jsonl"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "../../shared/traces/conversation_trace.jsonl"
}

// BenchmarkConversation8 replays the whole Mooncake conversation trace
// (12,031 requests) on 8 default-sized workers in each mode, on one
// goroutine, and reports CPU and wall seconds per replay (budget, DESIGN
// §7: ≤ 1 s wall on one thread), the hit ratio and the mean TTFT.
// The workload hashes its prompts once, in the first run. loop-cpu-s is
// the event loop's own thread CPU time, which leaves out the index's
// applier goroutine (feed.go) and the other processes' turns: the loop's
// share of the replay's critical path.
func BenchmarkConversation8(b *testing.B) {
	path := conversationTrace()
	if _, err := os.Stat(path); err != nil {
		b.Skipf("conversation trace not available (set KVMESH_TRACE): %v", err)
	}
	wl, err := LoadWorkload(path, LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	// Runs reuse the workload's prompt hashes; kv-cold runs kv on a fresh
	// workload each time, so it also pays hashing the trace's prompts.
	for _, m := range append(slices.Clone(Modes), "kv-cold") {
		b.Run(m, func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var r *Result
			cpu0, loop0 := cpuTime(), cputime.Thread()
			for b.Loop() {
				w, mode := wl, m
				if m == "kv-cold" {
					w, mode = &Workload{TraceBlockSize: wl.TraceBlockSize, Requests: wl.Requests}, string(router.ModeKV)
				}
				if r, err = Run(context.Background(), w, Config{Mode: mode, Seed: 1}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric((cpuTime()-cpu0).Seconds()/float64(b.N), "cpu-s/trace")
			b.ReportMetric((cputime.Thread()-loop0).Seconds()/float64(b.N), "loop-cpu-s/trace")
			b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/trace")
			b.ReportMetric(r.Hit.Total, "hit-ratio")
			b.ReportMetric(r.TTFT.Mean, "ttft-mean-ms")
			b.ReportMetric(float64(r.Passes), "passes")
			b.ReportMetric(r.IndexOffLoop, "index-off-loop")
		})
	}
}

// BenchmarkConversationPD replays the whole conversation trace in kv mode
// on 8 workers as 8 aggregated, 4 prefill + 4 decode and 2 + 6, reporting
// CPU and wall seconds per replay: the P/D runs' cost against the
// aggregated one's, measured in the same run.
func BenchmarkConversationPD(b *testing.B) {
	path := conversationTrace()
	if _, err := os.Stat(path); err != nil {
		b.Skipf("conversation trace not available (set KVMESH_TRACE): %v", err)
	}
	wl, err := LoadWorkload(path, LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range []struct {
		name      string
		agg, p, d int
	}{{"8agg", 8, 0, 0}, {"4P+4D", 0, 4, 4}, {"2P+6D", 0, 2, 6}} {
		b.Run(f.name, func(b *testing.B) {
			var r *Result
			cpu0 := cpuTime()
			for b.Loop() {
				if r, err = Run(context.Background(), wl, Config{Mode: string(router.ModeKV), Workers: f.agg, PrefillWorkers: f.p, DecodeWorkers: f.d, Seed: 1}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric((cpuTime()-cpu0).Seconds()/float64(b.N), "cpu-s/trace")
			b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/trace")
			b.ReportMetric(r.ITL.P99, "itl-p99-ms")
		})
	}
}
