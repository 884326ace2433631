//go:build !linux

package bench

import (
	"runtime"
	"time"
)

// dueWaiter parks its goroutine until an op's due time: off Linux with
// time.Sleep, then yielding in a loop for the last spinUnder.
type dueWaiter struct{}

const spinUnder = 200 * time.Microsecond

func newDueWaiter() *dueWaiter { return &dueWaiter{} }

func (w *dueWaiter) close() {}

func (w *dueWaiter) wait(t time.Time) {
	for {
		d := time.Until(t)
		switch {
		case d <= 0:
			return
		case d > spinUnder:
			time.Sleep(d - spinUnder)
		default:
			runtime.Gosched()
		}
	}
}
