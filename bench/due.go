package bench

import (
	"runtime"
	"time"
)

// spinUnder is how close to its due time an op yields in a loop instead
// of parking: a park and wake-up costs tens of µs of CPU and lands tens of
// µs late on a busy machine, and at high offered rates most waits are this
// short (bursts of the timeline ~100 µs apart), where yielding lets the
// writers run and costs less. It bounds the spin per op.
const spinUnder = 200 * time.Microsecond

// sleepUntil returns at t or soon after: time.Sleep to spinUnder before
// it, then a yield loop (the waiter without a timerfd).
func sleepUntil(t time.Time) {
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
