package twin

import (
	"context"
	"os"
	"testing"
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
func BenchmarkConversation8(b *testing.B) {
	path := conversationTrace()
	if _, err := os.Stat(path); err != nil {
		b.Skipf("conversation trace not available (set KVMESH_TRACE): %v", err)
	}
	wl, err := LoadWorkload(path, LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	for _, m := range Modes {
		b.Run(m, func(b *testing.B) {
			var r *Result
			cpu0 := cpuTime()
			for b.Loop() {
				if r, err = Run(context.Background(), wl, Config{Mode: m, Seed: 1}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric((cpuTime()-cpu0).Seconds()/float64(b.N), "cpu-s/trace")
			b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/trace")
			b.ReportMetric(r.Hit.Total, "hit-ratio")
			b.ReportMetric(r.TTFT.Mean, "ttft-mean-ms")
			b.ReportMetric(float64(r.Passes), "passes")
		})
	}
}
