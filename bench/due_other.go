//go:build !linux

package bench

import "time"

// dueWaiter parks its goroutine until an op's due time: off Linux with
// sleepUntil.
type dueWaiter struct{}

func newDueWaiter() *dueWaiter { return &dueWaiter{} }

func (w *dueWaiter) close() {}

func (w *dueWaiter) wait(t time.Time) { sleepUntil(t) }
