package sim

import (
	"math"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// Reference values from research/benchmarks.md §4.3 (rounded there to 0.1
// and 0.01 ms).
func TestTimingReferenceValues(t *testing.T) {
	prefill := []struct {
		tokens int
		ms     float64
	}{{0, 0}, {128, 18.5}, {512, 24.4}, {1024, 32.5}, {2048, 49.4}, {4096, 85.8}, {8192, 169.1}, {16384, 378.3}, {32768, 966.1}}
	for _, c := range prefill {
		if got := PrefillMS(c.tokens); math.Abs(got-c.ms) > 0.05 {
			t.Errorf("PrefillMS(%d) = %.3f, want %.1f", c.tokens, got, c.ms)
		}
	}
	decode := []struct{ p, ms float64 }{{0, 5.74}, {0.1, 10.88}, {0.25, 17.63}, {0.5, 26.31}, {0.75, 31.77}, {1, 34.01}, {1.5, 34.01}, {-1, 5.74}}
	for _, c := range decode {
		if got := DecodeMS(c.p); math.Abs(got-c.ms) > 0.005 {
			t.Errorf("DecodeMS(%g) = %.4f, want %.2f", c.p, got, c.ms)
		}
	}
	if got := (Polynomial{}).DecodeMS(262144, 1048576); got != DecodeMS(0.25) {
		t.Errorf("Polynomial.DecodeMS(¼ of capacity) = %g", got)
	}
	if got := TransferMS(64e9, 64e9); got != 1000 {
		t.Errorf("64 GB at 64 GB/s = %g ms", got)
	}
	if TransferMS(100, 0) != 0 {
		t.Error("zero bandwidth must mean free transfers")
	}
}

// TestStepDurationFollowsModel checks the pass durations a Core reports
// against the formulas: a cold chunked prefill, a decode pass, and a pass
// carrying a fetched block's transfer.
func TestStepDurationFollowsModel(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DecodeSpeedupRatio = 2
	c := mustCore(t, cfg)
	total := cfg.Blocks * cfg.BlockSize
	prompt := make([]kv.Token, 10000)
	for i := range prompt {
		prompt[i] = kv.Token(i)
	}
	c.Add(req("a", prompt, 3), time.Time{})
	want := []struct {
		prefill int
		active  int // 0 = no decode
	}{
		{8192, 0},     // first chunk: budget-limited, no token yet
		{1808, 10000}, // rest of the prompt, samples token 1
		{0, 10001},    // decode
		{0, 10002},    // decode, finishes
	}
	for i, w := range want {
		r := c.Step(time.Time{})
		ms := PrefillMS(w.prefill)
		if w.active > 0 {
			ms += DecodeMS(float64(w.active)/float64(total)) / 2
		}
		if r.PrefillTokens != w.prefill || r.ActiveKV != w.active || r.Duration != msToDuration(ms) {
			t.Fatalf("pass %d: prefill %d active %d duration %v, want %d %d %v",
				i, r.PrefillTokens, r.ActiveKV, r.Duration, w.prefill, w.active, msToDuration(ms))
		}
	}
	if !c.Idle() {
		t.Fatal("request did not finish after 3 tokens")
	}
}
