package twin

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/router"
)

// TestRouterQueueSlice overloads 2 small workers with the 300-request
// slice: with the router queue requests wait in it (and the wait is part
// of their TTFT), every one completes, and none is preempted on an
// engine; without it the same run is what it always was.
func TestRouterQueueSlice(t *testing.T) {
	wl := loadSlice(t)
	base := Config{Workers: 2, Blocks: 2048, Seed: 5, ArrivalSpeedup: 64}
	for _, mode := range []string{"round-robin", "kv", ModeKVHints} {
		c := base
		c.Mode = mode
		off := run(t, wl, c)
		if off.Queue != nil {
			t.Fatalf("%s: queue stats without a queue", mode)
		}
		c.Queue = &Queue{}
		on := run(t, wl, c)
		checkResult(t, on)
		q := on.Queue
		if q == nil || on.Requests != 300 || q.Policy != "fcfs" {
			t.Fatalf("%s with the queue: %d completed, stats %+v", mode, on.Requests, q)
		}
		if q.Queued == 0 || q.MaxDepth == 0 || q.Wait.N != 300 || !(q.Wait.Max > 0) {
			t.Fatalf("%s: the overload queued nothing: %+v", mode, q)
		}
		if on.TTFT.Mean < q.Wait.Mean {
			t.Fatalf("%s: mean TTFT %.1f ms under the mean queue wait %.1f ms: the wait is not in the TTFT", mode, on.TTFT.Mean, q.Wait.Mean)
		}
		if off.Preemptions == 0 {
			t.Fatalf("%s: the slice does not overload the engines (no preemptions without the queue)", mode)
		}
		if on.Preemptions >= off.Preemptions {
			t.Errorf("%s: %d preemptions with the queue, %d without", mode, on.Preemptions, off.Preemptions)
		}
	}
}

// TestRouterQueueLimit: past the limit a request is refused (the frontend's
// 429), and the rest still complete.
func TestRouterQueueLimit(t *testing.T) {
	wl := loadSlice(t)
	c := Config{Mode: "kv", Workers: 2, Blocks: 2048, Seed: 5, ArrivalSpeedup: 64,
		Queue: &Queue{QueueConfig: router.QueueConfig{Limit: 2}}}
	r := run(t, wl, c)
	checkResult(t, r)
	if r.RejectedBusy == 0 || r.Queue.MaxDepth > 2 || r.Requests == 0 {
		t.Fatalf("limit 2: %d refused, depth up to %d, %d completed", r.RejectedBusy, r.Queue.MaxDepth, r.Requests)
	}
	if r.RejectReasons[0] != "router queue full" {
		t.Fatalf("refusal reason %q", r.RejectReasons[0])
	}
}

func TestRouterQueueConfig(t *testing.T) {
	for _, c := range []Config{
		{Queue: &Queue{QueueConfig: router.QueueConfig{Policy: "lifo"}}},
		{Queue: &Queue{QueueConfig: router.QueueConfig{Limit: -1}}, PrefillWorkers: 1, DecodeWorkers: 1},
	} {
		if _, err := c.Normalize(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}

// TestRouterQueuePD overloads a 1+1 P/D fleet with the slice: with the
// queue every request waits for its legs' workers and completes, prefill
// legs and decode legs both having waited, and the engines preempt and
// the decode legs recompute less than when everything is piled on them.
func TestRouterQueuePD(t *testing.T) {
	wl := loadSlice(t)
	c := Config{Mode: "kv", PrefillWorkers: 1, DecodeWorkers: 1, Blocks: 2048, Seed: 5, ArrivalSpeedup: 64}
	off := run(t, wl, c)
	c.Queue = &Queue{}
	on := run(t, wl, c)
	checkResult(t, on)
	q, ps := on.Queue, on.Paths
	if on.Requests != 300 || on.RejectedBusy != 0 {
		t.Fatalf("with the queue: %d completed, %d refused", on.Requests, on.RejectedBusy)
	}
	if q.Queued == 0 || q.Wait.N != 300 || q.DecodeQueued == 0 {
		t.Fatalf("the overload queued no leg: %+v", q)
	}
	if ps.Disagg == 0 || ps.Handoffs == 0 || ps.Disagg+ps.LocalPrefill != 300 {
		t.Fatalf("paths %+v", ps)
	}
	if on.TTFT.Mean < q.Wait.Mean {
		t.Fatalf("mean TTFT %.1f ms under the mean queue wait %.1f ms", on.TTFT.Mean, q.Wait.Mean)
	}
	if off.Preemptions == 0 || on.Preemptions >= off.Preemptions || on.Paths.Recomputes >= off.Paths.Recomputes {
		t.Errorf("preemptions %d → %d, recomputes %d → %d with the queue", off.Preemptions, on.Preemptions, off.Paths.Recomputes, on.Paths.Recomputes)
	}
}

// TestRouterQueueRefusedSkip: a request every worker refused (round-robin,
// random) is routed again only once a worker that changed since would
// take it; that skips most of its routings and changes no outcome.
func TestRouterQueueRefusedSkip(t *testing.T) {
	wl := loadSlice(t)
	agg := Config{Workers: 2, Blocks: 2048, Seed: 5, ArrivalSpeedup: 64, Queue: &Queue{}}
	pd := Config{PrefillWorkers: 1, DecodeWorkers: 1, Blocks: 2048, Seed: 5, ArrivalSpeedup: 64, Queue: &Queue{}}
	cases := []struct {
		name string
		c    Config
	}{{"round-robin", agg}, {"random", agg}, {"round-robin, 1+1 P/D", pd}}
	for _, tc := range cases {
		c := tc.c
		c.Mode, _, _ = strings.Cut(tc.name, ",")
		skip := run(t, wl, c)
		reaskRefused = true
		all := run(t, wl, c)
		reaskRefused = false
		checkResult(t, skip)
		if skip.refusedSkips == 0 || all.refusedSkips != 0 {
			t.Fatalf("%s: %d routings skipped, %d when re-asking every time", tc.name, skip.refusedSkips, all.refusedSkips)
		}
		a, _ := json.Marshal(outcome(skip))
		b, _ := json.Marshal(outcome(all))
		if string(a) != string(b) {
			t.Fatalf("%s: the skip changed the outcome:\n%s\n%s", tc.name, a, b)
		}
	}
}

// outcome is r without what depends on the host (wall and CPU time).
func outcome(r *Result) Result {
	o := *r
	o.refusedSkips, o.Wall, o.CPU = 0, 0, 0
	return o
}
