package bench

import (
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/cputime"
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

// The timer path's wake-up (a wait past spinUnder) on an otherwise idle
// process: time.Sleep's rounds up to the netpoller's millisecond there, which is what dueWaiter
// exists to avoid; and what a wait costs the process in CPU (every
// thread's: the runtime's spinning Ms too). Reported, not asserted: wall
// time on a shared box.
func BenchmarkDueWaiter500us(b *testing.B) {
	w := newDueWaiter()
	defer w.close()
	benchWait(b, w.wait)
}

func BenchmarkSleep500us(b *testing.B) {
	benchWait(b, func(t time.Time) { time.Sleep(time.Until(t)) })
}

func benchWait(b *testing.B, wait func(time.Time)) {
	var late time.Duration
	cpu0 := cputime.Process()
	for b.Loop() {
		due := time.Now().Add(500 * time.Microsecond)
		wait(due)
		late += time.Since(due)
	}
	b.ReportMetric(float64((cputime.Process()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
	b.ReportMetric(float64(late.Microseconds())/float64(b.N), "µs-late/op")
}
