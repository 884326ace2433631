package router

import (
	"context"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

func TestPlanHint(t *testing.T) {
	seq := make([]kv.SeqHash, 10)
	for i := range seq {
		seq[i] = kv.SeqHash(1000 + i)
	}
	m := func(w uint64, d uint32) Match {
		return Match{Worker: key(w), Depth: [kv.NumTiers]uint32{d, d, d, d}}
	}
	base := []WorkerInfo{winfo(1), winfo(2), winfo(3), winfo(4)}
	for _, tc := range []struct {
		name    string
		target  uint64
		edit    func(ws []WorkerInfo)
		matches []Match
		want    uint64 // source; 0 = no hint
		n       int
	}{
		{"longest wins", 1, nil, []Match{m(1, 2), m(2, 5), m(3, 8)}, 3, 8},
		{"tie goes to lowest key", 1, nil, []Match{m(2, 6), m(3, 6), m(4, 6)}, 2, 6},
		{"target already longest", 3, nil, []Match{m(1, 2), m(2, 5), m(3, 8)}, 0, 0},
		{"equal is not longer", 2, nil, []Match{m(2, 5), m(3, 5)}, 0, 0},
		{"target not hint-capable", 1, func(ws []WorkerInfo) { ws[0].HintCapable = false }, []Match{m(3, 8)}, 0, 0},
		{"source without endpoint", 1, func(ws []WorkerInfo) { ws[2].ControlEndpoint = "" }, []Match{m(2, 5), m(3, 8)}, 2, 5},
		{"source with another digest", 1, func(ws []WorkerInfo) { ws[2].Digest = "other" }, []Match{m(2, 5), m(3, 8)}, 2, 5},
		{"source with another role", 1, func(ws []WorkerInfo) { ws[2].Role = kv.RolePrefill }, []Match{m(2, 5), m(3, 8)}, 2, 5},
		{"source not a live worker", 1, nil, []Match{m(2, 5), m(9, 9)}, 2, 5},
		{"prefix capped at the request", 1, nil, []Match{m(2, 50)}, 2, 10},
		{"cold target", 4, nil, []Match{m(1, 1)}, 1, 1},
	} {
		ws := slices.Clone(base)
		if tc.edit != nil {
			tc.edit(ws)
		}
		plan, ok := PlanHint(ws[tc.target-1], ws, tc.matches, seq)
		if tc.want == 0 {
			if ok {
				t.Errorf("%s: unexpected hint %+v", tc.name, plan)
			}
			continue
		}
		if !ok || plan.Source != key(tc.want) || plan.Endpoint != ws[tc.want-1].ControlEndpoint ||
			!slices.Equal(plan.SeqHashes, kv.RawHashes(seq[:tc.n])) {
			t.Errorf("%s: plan %+v ok=%v, want source %d with %d blocks", tc.name, plan, ok, tc.want, tc.n)
		}
	}
}

func TestRouteAttachesHint(t *testing.T) {
	ix := newFakeIndex()
	// The prefix holder is loaded, so the router picks an idle worker and
	// hints it to fetch from the holder.
	r := newRouter(t, Config{Matcher: ix, Hints: true}, 1, 2)
	p := prompt(1, 320)
	seq := seqOf(p)
	ix.store(key(1), kv.TierDevice, seq[:12])
	heavy, err := r.Route(context.Background(), Request{Model: "m", Tokens: prompt(2, 8000), Exclude: []kv.WorkerKey{key(2)}})
	if err != nil || heavy.Worker != key(1) {
		t.Fatalf("heavy request: %v %v", heavy, err)
	}
	d := route(t, r, p)
	if d.Worker != key(2) {
		t.Fatalf("went to %v, want the idle worker", d.Worker)
	}
	if d.Hint == nil || d.Hint.Source != key(1) || !slices.Equal(d.Hint.SeqHashes, kv.RawHashes(seq[:12])) || d.Hint.TargetBlocks != 0 {
		t.Fatalf("hint %+v", d.Hint)
	}
	// Routed to the holder itself: no hint.
	heavy.Done()
	d.Done()
	if d := route(t, r, p); d.Worker != key(1) || d.Hint != nil {
		t.Fatalf("holder decision %v hint %+v", d.Worker, d.Hint)
	}
	// Hints off: never a plan.
	r2 := newRouter(t, Config{Matcher: ix}, 1, 2)
	route(t, r2, prompt(2, 8000))
	if d := route(t, r2, p); d.Hint != nil {
		t.Fatal("hint with Hints off")
	}
}
