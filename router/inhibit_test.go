package router

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// routedTo routes n requests and returns the set of workers chosen.
func routedTo(t *testing.T, r *Router, n int) map[kv.WorkerKey]bool {
	t.Helper()
	got := map[kv.WorkerKey]bool{}
	for i := range n {
		d := route(t, r, prompt(100+i, 64))
		got[d.Worker] = true
		d.Done()
	}
	return got
}

func TestInhibitUntilDeadline(t *testing.T) {
	clk := newFakeClock()
	r := newRouter(t, Config{Mode: ModeRoundRobin, InhibitFor: 5 * time.Second, Now: clk.Now}, 1, 2)
	r.Inhibit(key(1))
	if got := routedTo(t, r, 4); got[key(1)] || !got[key(2)] {
		t.Fatalf("inhibited worker 1 chosen: %v", got)
	}
	clk.Advance(5*time.Second - time.Nanosecond)
	if got := routedTo(t, r, 4); got[key(1)] {
		t.Fatalf("worker 1 chosen before its deadline: %v", got)
	}
	clk.Advance(time.Nanosecond)
	if got := routedTo(t, r, 4); !got[key(1)] || !got[key(2)] {
		t.Fatalf("after the deadline round robin should use both: %v", got)
	}
	if len(r.inhibited) != 0 {
		t.Fatalf("lapsed inhibition kept: %v", r.inhibited)
	}

	// A second Inhibit extends the deadline.
	r.Inhibit(key(1))
	clk.Advance(3 * time.Second)
	r.Inhibit(key(1))
	clk.Advance(3 * time.Second)
	if got := routedTo(t, r, 4); got[key(1)] {
		t.Fatalf("re-inhibited worker chosen 6 s after the first Inhibit: %v", got)
	}
}

// A worker that discovery dropped and lists again is routable at once: the
// new registration outranks the failure that inhibited it. A refresh of a
// registered worker (the same record again) does not lift it.
func TestReregistrationLiftsInhibition(t *testing.T) {
	clk := newFakeClock()
	r := newRouter(t, Config{Mode: ModeRoundRobin, Now: clk.Now}, 1, 2)
	r.Inhibit(key(1))
	if err := r.AddWorker(winfo(1)); err != nil {
		t.Fatal(err)
	}
	if got := routedTo(t, r, 4); got[key(1)] {
		t.Fatalf("a refreshed registration lifted the inhibition: %v", got)
	}
	r.RemoveWorker(key(1))
	if err := r.AddWorker(winfo(1)); err != nil {
		t.Fatal(err)
	}
	if got := routedTo(t, r, 4); !got[key(1)] {
		t.Fatalf("re-registered worker still inhibited: %v", got)
	}
}

func TestInhibitAllIsNoWorkers(t *testing.T) {
	clk := newFakeClock()
	r := newRouter(t, Config{Mode: ModeRoundRobin, Now: clk.Now}, 1, 2)
	r.Inhibit(key(1))
	// The request's own exclusions and the inhibited keys add up; the
	// caller's slice is not written (spare capacity would invite it).
	exclude := make([]kv.WorkerKey, 1, 8)
	exclude[0] = key(2)
	_, err := r.Route(context.Background(), Request{Model: "m", Tokens: prompt(1, 64), Exclude: exclude})
	if !errors.Is(err, kv.ErrNoWorkers) {
		t.Fatalf("every worker excluded or inhibited: %v, want kv.ErrNoWorkers", err)
	}
	if full := exclude[:cap(exclude)]; full[1] != (kv.WorkerKey{}) {
		t.Fatalf("Route wrote into the caller's Exclude: %v", full)
	}
	clk.Advance(DefaultInhibitFor)
	if d := route(t, r, prompt(1, 64)); d.Worker != key(1) && d.Worker != key(2) {
		t.Fatalf("routed to %v", d.Worker)
	}
}

func TestDecisionFail(t *testing.T) {
	clk := newFakeClock()
	r := newRouter(t, Config{Mode: ModeRoundRobin, Now: clk.Now}, 1, 2)
	d := route(t, r, prompt(1, 64))
	failed := d.Worker
	d.Fail()
	d.Fail() // idempotent: frees once
	d.Done()
	if l := r.Load(failed); l.ActiveRequests != 0 || l.ActivePrefillTokens != 0 || l.ActiveBlocks != 0 {
		t.Fatalf("failed decision still books load: %+v", l)
	}
	if got := routedTo(t, r, 4); got[failed] {
		t.Fatalf("worker %v failed a request and was chosen again: %v", failed, got)
	}
}

// An inhibited worker is no hint source either: it is likely dead, and a
// fetch from it would fail.
func TestInhibitedWorkerIsNoHintSource(t *testing.T) {
	ix := newFakeIndex()
	clk := newFakeClock()
	r := newRouter(t, Config{Matcher: ix, Hints: true, Now: clk.Now}, 1, 2)
	p := prompt(1, 320)
	ix.store(key(1), kv.TierDevice, seqOf(p)[:12])
	r.Inhibit(key(1))
	d := route(t, r, p)
	if d.Worker != key(2) || d.Hint != nil {
		t.Fatalf("routed to %v with hint %+v; want worker 2 without a hint", d.Worker, d.Hint)
	}
	d.Done()
	clk.Advance(DefaultInhibitFor)
	heavy, err := r.Route(context.Background(), Request{Model: "m", Tokens: prompt(2, 8000), Exclude: []kv.WorkerKey{key(2)}})
	if err != nil || heavy.Worker != key(1) {
		t.Fatalf("heavy request: %v %v", heavy, err)
	}
	d = route(t, r, p)
	if d.Worker != key(2) || d.Hint == nil || d.Hint.Source != key(1) || !slices.Equal(d.Hint.Hashes, ix.engineHashes(key(1), seqOf(p)[:12])) {
		t.Fatalf("after the deadline: routed to %v with hint %+v; want worker 2 hinted to 1", d.Worker, d.Hint)
	}
}
