package clock

import (
	"container/heap"
	"context"
	"sync"
	"time"
)

// Virtual is a clock whose time moves only when Advance, AdvanceTo or Step
// is called. Timers fire in deadline order (ties in creation order) inside
// those calls; AfterFunc callbacks run synchronously there and may create or
// stop timers. It is safe for concurrent use, but a single-threaded driver
// (the twin) never needs a second goroutine.
type Virtual struct {
	mu      sync.Mutex
	now     time.Time
	seq     uint64
	timers  timerHeap
	changed chan struct{} // closed and replaced whenever the timer set grows
}

// Epoch is the default start of a Virtual clock: a fixed instant, so runs
// are reproducible.
var Epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// NewVirtual returns a virtual clock reading start (Epoch if zero).
func NewVirtual(start time.Time) *Virtual {
	if start.IsZero() {
		start = Epoch
	}
	return &Virtual{now: start, changed: make(chan struct{})}
}

// Now returns the virtual time.
func (v *Virtual) Now() time.Time {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.now
}

type vtimer struct {
	v   *Virtual
	at  time.Time
	seq uint64
	idx int // position in the heap, -1 when not pending
	c   chan time.Time
	f   func()
}

func (t *vtimer) C() <-chan time.Time { return t.c }

func (t *vtimer) Stop() bool {
	t.v.mu.Lock()
	defer t.v.mu.Unlock()
	if t.idx < 0 {
		return false
	}
	heap.Remove(&t.v.timers, t.idx)
	return true
}

func (v *Virtual) add(d time.Duration, c chan time.Time, f func()) *vtimer {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.seq++
	t := &vtimer{v: v, at: v.now.Add(max(d, 0)), seq: v.seq, c: c, f: f}
	heap.Push(&v.timers, t)
	close(v.changed)
	v.changed = make(chan struct{})
	return t
}

// NewTimer returns a timer firing when the clock reaches Now()+d. A timer
// with d ≤ 0 fires on the next Advance/Step, even Advance(0).
func (v *Virtual) NewTimer(d time.Duration) Timer {
	return v.add(d, make(chan time.Time, 1), nil)
}

// AfterFunc schedules f at Now()+d; f runs in the goroutine that advances
// the clock, with the clock already reading f's deadline.
func (v *Virtual) AfterFunc(d time.Duration, f func()) Timer {
	return v.add(d, nil, f)
}

// Pending is the number of timers not yet fired or stopped.
func (v *Virtual) Pending() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.timers)
}

// Next returns the deadline of the earliest pending timer.
func (v *Virtual) Next() (time.Time, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.timers) == 0 {
		return time.Time{}, false
	}
	return v.timers[0].at, true
}

// Advance moves the clock forward by d, firing every timer due on the way.
func (v *Virtual) Advance(d time.Duration) {
	v.mu.Lock()
	to := v.now.Add(max(d, 0))
	v.mu.Unlock()
	v.AdvanceTo(to)
}

// AdvanceTo moves the clock to t (never backwards), firing every timer with
// a deadline ≤ t in order; the clock reads each timer's deadline while it
// fires.
func (v *Virtual) AdvanceTo(t time.Time) {
	for v.fireNext(t) {
	}
	v.mu.Lock()
	if t.After(v.now) {
		v.now = t
	}
	v.mu.Unlock()
}

// Step jumps to the earliest pending timer and fires it and every other
// timer due at that instant. It reports false when no timer is pending.
func (v *Virtual) Step() bool {
	at, ok := v.Next()
	if !ok {
		return false
	}
	v.AdvanceTo(at)
	return true
}

// fireNext fires the earliest timer due by limit, if any.
func (v *Virtual) fireNext(limit time.Time) bool {
	v.mu.Lock()
	if len(v.timers) == 0 || v.timers[0].at.After(limit) {
		v.mu.Unlock()
		return false
	}
	t := heap.Pop(&v.timers).(*vtimer)
	if t.at.After(v.now) {
		v.now = t.at
	}
	now := v.now
	v.mu.Unlock()
	if t.f != nil {
		t.f()
	} else {
		select {
		case t.c <- now:
		default:
		}
	}
	return true
}

// BlockUntil waits until at least n timers are pending or ctx ends. Tests
// use it to let a goroutine reach its sleep before advancing the clock.
func (v *Virtual) BlockUntil(ctx context.Context, n int) error {
	for {
		v.mu.Lock()
		if len(v.timers) >= n {
			v.mu.Unlock()
			return nil
		}
		ch := v.changed
		v.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

type timerHeap []*vtimer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *timerHeap) Push(x any) {
	t := x.(*vtimer)
	t.idx = len(*h)
	*h = append(*h, t)
}
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	t.idx = -1
	*h = old[:len(old)-1]
	return t
}
