package bench

import (
	"testing"
	"time"
)

// A wait never ends before its due time, whichever path it takes: past,
// spun, or armed (the timerfd on Linux), and one waiter serves many waits
// in a row, as a finder's does (a stale expiry must not end the next).
func TestDueWaiterNeverEarly(t *testing.T) {
	w := newDueWaiter()
	defer w.close()
	for _, d := range []time.Duration{-time.Millisecond, 0, 5 * time.Microsecond, spinUnder / 2, 3 * spinUnder, 150 * time.Microsecond, 1500 * time.Microsecond, 40 * time.Microsecond, 2 * time.Millisecond} {
		for range 20 {
			due := time.Now().Add(d)
			w.wait(due)
			if now := time.Now(); now.Before(due) {
				t.Fatalf("a wait of %v returned %v early", d, due.Sub(now))
			}
		}
	}
}

// The timer path's wake-up on an otherwise idle process: time.Sleep's
// rounds up to the netpoller's millisecond there, which is what dueWaiter
// exists to avoid. Reported, not asserted, as wall time on a shared box.
func BenchmarkDueWaiter100us(b *testing.B) {
	w := newDueWaiter()
	defer w.close()
	var late time.Duration
	for b.Loop() {
		due := time.Now().Add(100 * time.Microsecond)
		w.wait(due)
		late += time.Since(due)
	}
	b.ReportMetric(float64(late.Microseconds())/float64(b.N), "µs-late/op")
}

func BenchmarkSleep100us(b *testing.B) {
	var late time.Duration
	for b.Loop() {
		due := time.Now().Add(100 * time.Microsecond)
		time.Sleep(100 * time.Microsecond)
		late += time.Since(due)
	}
	b.ReportMetric(float64(late.Microseconds())/float64(b.N), "µs-late/op")
}
