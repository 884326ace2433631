// Package clock is an injectable clock. Wall is real time; Virtual is time
// that only moves when a driver advances it, so a simulation can run
// thousands of simulated seconds per real second without sleeping.
//
// It imports nothing of kvmesh.
package clock

import (
	"context"
	"time"
)

// Clock tells time and makes timers.
type Clock interface {
	Now() time.Time
	// NewTimer returns a timer whose channel receives the clock's time once d
	// has passed.
	NewTimer(d time.Duration) Timer
	// AfterFunc calls f once d has passed. On Wall f runs in its own
	// goroutine (as time.AfterFunc); on Virtual it runs synchronously in the
	// goroutine that advances the clock.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending one-shot event.
type Timer interface {
	// C is the channel the time is delivered on; nil for AfterFunc timers.
	C() <-chan time.Time
	// Stop prevents the timer from firing; false if it already fired or was
	// stopped.
	Stop() bool
}

// Sleep waits d on c, returning ctx's error if ctx ends first. A
// non-positive d returns at once (after checking ctx).
func Sleep(ctx context.Context, c Clock, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := c.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Since is c.Now().Sub(t).
func Since(c Clock, t time.Time) time.Duration { return c.Now().Sub(t) }

// Wall is real time.
type Wall struct{}

// NewWall returns the real-time clock.
func NewWall() Wall { return Wall{} }

func (Wall) Now() time.Time { return time.Now() }

func (Wall) NewTimer(d time.Duration) Timer { return wallTimer{t: time.NewTimer(d)} }

func (Wall) AfterFunc(d time.Duration, f func()) Timer {
	return wallTimer{t: time.AfterFunc(d, f)}
}

type wallTimer struct{ t *time.Timer }

func (w wallTimer) C() <-chan time.Time { return w.t.C }
func (w wallTimer) Stop() bool          { return w.t.Stop() }
