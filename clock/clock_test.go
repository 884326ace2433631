package clock

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestVirtualFiresInOrderWithoutSleeping(t *testing.T) {
	v := NewVirtual(time.Time{})
	start := v.Now()
	if !start.Equal(Epoch) {
		t.Fatalf("start %v, want Epoch", start)
	}
	var order []int
	var at []time.Duration
	rec := func(i int) func() {
		return func() { order = append(order, i); at = append(at, v.Now().Sub(start)) }
	}
	v.AfterFunc(3*time.Second, rec(3))
	v.AfterFunc(time.Second, rec(1))
	v.AfterFunc(time.Second, rec(2)) // same deadline: creation order
	stopped := v.AfterFunc(2*time.Second, rec(99))
	if !stopped.Stop() || stopped.Stop() {
		t.Fatal("Stop must report true once, then false")
	}
	// A callback scheduling another timer inside the advanced window fires too.
	v.AfterFunc(1500*time.Millisecond, func() { v.AfterFunc(100*time.Millisecond, rec(4)) })

	wall := time.Now()
	v.Advance(2 * time.Second)
	if got := v.Now().Sub(start); got != 2*time.Second {
		t.Fatalf("now %v after Advance(2s)", got)
	}
	want := []int{1, 2, 4}
	if len(order) != len(want) {
		t.Fatalf("fired %v, want %v", order, want)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("fired %v, want %v", order, want)
		}
	}
	if at[0] != time.Second || at[2] != 1600*time.Millisecond {
		t.Fatalf("callbacks saw times %v", at)
	}
	if v.Pending() != 1 {
		t.Fatalf("pending %d, want 1", v.Pending())
	}
	if next, ok := v.Next(); !ok || next.Sub(start) != 3*time.Second {
		t.Fatalf("Next = %v %v", next, ok)
	}
	if !v.Step() || order[len(order)-1] != 3 || v.Now().Sub(start) != 3*time.Second {
		t.Fatalf("Step did not fire the 3 s timer: %v at %v", order, v.Now().Sub(start))
	}
	if v.Step() {
		t.Fatal("Step with nothing pending must report false")
	}
	if time.Since(wall) > time.Second {
		t.Fatal("virtual clock slept")
	}
	// Never backwards.
	v.AdvanceTo(start)
	if v.Now().Sub(start) != 3*time.Second {
		t.Fatal("AdvanceTo moved the clock backwards")
	}
}

func TestVirtualTimerChannelAndSleep(t *testing.T) {
	v := NewVirtual(time.Time{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Sleep(ctx, v, time.Hour) }()
	if err := v.BlockUntil(ctx, 1); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
		t.Fatal("Sleep returned before the clock moved")
	default:
	}
	v.Advance(time.Hour)
	if err := <-done; err != nil {
		t.Fatalf("Sleep: %v", err)
	}

	// Cancellation ends a virtual sleep and leaves no pending timer.
	ctx2, cancel2 := context.WithCancel(ctx)
	go func() { done <- Sleep(ctx2, v, time.Hour) }()
	if err := v.BlockUntil(ctx, 1); err != nil {
		t.Fatal(err)
	}
	cancel2()
	if err := <-done; err != context.Canceled {
		t.Fatalf("Sleep after cancel: %v", err)
	}
	if v.Pending() != 0 {
		t.Fatalf("a cancelled Sleep left %d timers", v.Pending())
	}

	tm := v.NewTimer(0)
	v.Advance(0)
	select {
	case got := <-tm.C():
		if !got.Equal(v.Now()) {
			t.Fatalf("timer delivered %v, clock reads %v", got, v.Now())
		}
	default:
		t.Fatal("a zero timer must fire on Advance(0)")
	}
}

func TestWall(t *testing.T) {
	var c Clock = NewWall()
	if d := time.Since(c.Now()); d < 0 || d > time.Second {
		t.Fatalf("wall clock off by %v", d)
	}
	if err := Sleep(context.Background(), c, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	fired := make(chan struct{})
	c.AfterFunc(time.Millisecond, func() { close(fired) })
	<-fired
	tm := c.NewTimer(time.Hour)
	if !tm.Stop() {
		t.Fatal("stopping a pending wall timer must report true")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Sleep(ctx, c, time.Hour); err != context.Canceled {
		t.Fatalf("Sleep on a cancelled context: %v", err)
	}
}

func BenchmarkVirtualAfterFuncStep(b *testing.B) {
	v := NewVirtual(time.Time{})
	f := func() {}
	for b.Loop() {
		v.AfterFunc(time.Millisecond, f)
		v.Step()
	}
}
