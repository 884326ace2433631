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
