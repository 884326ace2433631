package fleet

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
)

func qworker(i uint64) router.WorkerInfo {
	return router.WorkerInfo{Key: kv.WorkerKey{Instance: i}, Model: "m", BlockSize: 16, KVBlocks: 100000, MaxBatchedTokens: 1000}
}

func qtokens(seed, n int) []kv.Token {
	out := make([]kv.Token, n)
	for i := range out {
		out[i] = kv.Token(seed*1_000_003 + i)
	}
	return out
}

// newQueueRig is a round-robin router over workers 1 and 2, each given a
// request with a pass of prefill (so neither admits another), and a live
// queue over it with limit; it returns the queue and the two bookings.
func newQueueRig(t *testing.T, limit int) (*liveQueue, *router.Router, [2]*router.Decision) {
	t.Helper()
	r, err := router.New(router.Config{Mode: router.ModeRoundRobin, Admit: &router.AdmitConfig{PrefillPasses: 1, KVUsage: -1, Waiting: -1}})
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []uint64{1, 2} {
		if err := r.AddWorker(qworker(i)); err != nil {
			t.Fatal(err)
		}
	}
	var ds [2]*router.Decision
	for i := range ds {
		if ds[i], err = r.Route(context.Background(), router.Request{Model: "m", Tokens: qtokens(i, 2000)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Route(context.Background(), router.Request{Model: "m", Tokens: qtokens(9, 10)}); !errors.Is(err, kv.ErrAllBusy) {
		t.Fatalf("with both workers a pass behind: %v, want busy", err)
	}
	lq, err := newLiveQueue(r, router.QueueConfig{Limit: limit})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { lq.run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return lq, r, ds
}

type awaited struct {
	d   *router.Decision
	err error
}

func awaitAsync(lq *liveQueue, ctx context.Context, seed int) <-chan awaited {
	ch := make(chan awaited, 1)
	go func() {
		d, err := lq.await(ctx, router.Request{Model: "m", Tokens: qtokens(seed, 10)})
		ch <- awaited{d, err}
	}()
	return ch
}

// waitDepth waits until n requests are queued.
func waitDepth(t *testing.T, lq *liveQueue, n int) {
	t.Helper()
	for range 2000 {
		lq.mu.Lock()
		got := lq.q.Len()
		lq.mu.Unlock()
		if got == n {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("queue never reached depth %d", n)
}

func TestLiveQueueFullAndDispatch(t *testing.T) {
	lq, _, ds := newQueueRig(t, 1)
	first := awaitAsync(lq, context.Background(), 10)
	waitDepth(t, lq, 1)
	_, err := lq.await(context.Background(), router.Request{Model: "m", Tokens: qtokens(11, 10)})
	var full *kv.QueueFullError
	if !errors.As(err, &full) || full.RetryAfter <= 0 {
		t.Fatalf("past the limit: %v, want a *kv.QueueFullError with a retry time", err)
	}
	ds[1].FirstToken() // worker 2's prefill is done: it admits
	got := <-first
	if got.err != nil || got.d.Worker.Instance != 2 {
		t.Fatalf("queued request: %+v, want worker 2", got)
	}
	got.d.Done()
}

func TestLiveQueueCancelFreesSlot(t *testing.T) {
	lq, _, _ := newQueueRig(t, 1)
	ctx, cancel := context.WithCancel(context.Background())
	ch := awaitAsync(lq, ctx, 10)
	waitDepth(t, lq, 1)
	cancel()
	if got := <-ch; !errors.Is(got.err, context.Canceled) || got.d != nil {
		t.Fatalf("cancelled waiter: %+v", got)
	}
	lq.mu.Lock()
	n := lq.q.Len()
	lq.mu.Unlock()
	if n != 0 {
		t.Fatalf("depth %d after the only waiter left, want 0 at once", n)
	}
	// Its slot is free: another request queues instead of a 429.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	ch2 := awaitAsync(lq, ctx2, 11)
	waitDepth(t, lq, 1)
	cancel2()
	<-ch2
}

// A worker dies while a request waits: the request is bound to none, so
// it goes to a worker that joins (or frees) afterwards.
func TestLiveQueueSurvivesWorkerDeath(t *testing.T) {
	lq, r, ds := newQueueRig(t, 0)
	ch := awaitAsync(lq, context.Background(), 10)
	waitDepth(t, lq, 1)
	r.RemoveWorker(kv.WorkerKey{Instance: 1})
	ds[0].Fail()
	if err := r.AddWorker(qworker(3)); err != nil {
		t.Fatal(err)
	}
	got := <-ch
	if got.err != nil || got.d.Worker.Instance != 3 {
		t.Fatalf("after worker 1 died and 3 joined: %+v, want worker 3", got)
	}
	got.d.Done()
}

// routesAfter waits until the queue has made at least n routing attempts
// and returns the count.
func routesAfter(t *testing.T, lq *liveQueue, n int) int {
	t.Helper()
	for range 2000 {
		lq.mu.Lock()
		got := lq.routes
		lq.mu.Unlock()
		if got >= n {
			return got
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("the queue never made %d routing attempts", n)
	return 0
}

// Refused requests are not routed again while no worker changes; the first
// change (a first token) dispatches them at the next poll.
func TestLiveQueueRefusedSkip(t *testing.T) {
	const n, window = 16, 200 * time.Millisecond
	rate := func(ctx context.Context, reask time.Duration) (perSec float64, lq *liveQueue, ds [2]*router.Decision, chs []<-chan awaited) {
		lq, _, ds = newQueueRig(t, 0)
		lq.mu.Lock()
		lq.reask = reask
		lq.mu.Unlock()
		for i := range n {
			chs = append(chs, awaitAsync(lq, ctx, 10+i))
		}
		waitDepth(t, lq, n)
		before := routesAfter(t, lq, n) // each routed (and refused) once
		time.Sleep(window)
		after := routesAfter(t, lq, 0)
		return float64(after-before) / window.Seconds(), lq, ds, chs
	}
	// reask 0: every poll routes every waiting request, as before the skip.
	ctx, cancel := context.WithCancel(context.Background())
	base, _, _, baseChs := rate(ctx, 0)
	cancel()
	for _, ch := range baseChs {
		<-ch
	}
	skip, lq, ds, chs := rate(context.Background(), time.Hour)
	t.Logf("%d waiting, nothing changing: %.0f routing attempts/s re-asking at every poll, %.0f with the skip", n, base, skip)
	if skip != 0 {
		t.Fatalf("%.0f routing attempts/s while no worker changed, want 0", skip)
	}
	if base < n*10 { // at least 2 polls in the window
		t.Fatalf("baseline %.0f attempts/s: the rig does not poll", base)
	}
	// The bounded fallback: with nothing changing, refused requests are
	// still routed again once reask passed.
	lq.mu.Lock()
	lq.reask = 20 * time.Millisecond
	lq.mu.Unlock()
	routesAfter(t, lq, routesAfter(t, lq, 0)+n)
	start := time.Now()
	ds[1].FirstToken() // worker 2's prefill is done: it admits them all
	for _, ch := range chs {
		got := <-ch
		if got.err != nil || got.d.Worker.Instance != 2 {
			t.Fatalf("after worker 2's first token: %+v, want worker 2", got)
		}
		got.d.Done()
	}
	if wait := time.Since(start); wait > 2*time.Second {
		t.Fatalf("dispatched %v after the worker freed", wait)
	}
}
