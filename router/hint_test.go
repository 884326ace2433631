package router

import (
	"context"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

func TestPlanHint(t *testing.T) {
	const nblocks = 10
	base := []WorkerInfo{winfo(1), winfo(2), winfo(3), winfo(4)}
	for _, tc := range []struct {
		name   string
		target uint64
		edit   func(ws []WorkerInfo)
		depth  []uint32 // deepest-tier depth of workers 1..4
		want   uint64   // source; 0 = no hint
		n      int
	}{
		{"longest wins", 1, nil, []uint32{2, 5, 8, 0}, 3, 8},
		{"tie goes to lowest key", 1, nil, []uint32{0, 6, 6, 6}, 2, 6},
		{"target already longest", 3, nil, []uint32{2, 5, 8, 0}, 0, 0},
		{"equal is not longer", 2, nil, []uint32{0, 5, 5, 0}, 0, 0},
		{"target not hint-capable", 1, func(ws []WorkerInfo) { ws[0].HintCapable = false }, []uint32{0, 0, 8, 0}, 0, 0},
		{"source without endpoint", 1, func(ws []WorkerInfo) { ws[2].ControlEndpoint = "" }, []uint32{0, 5, 8, 0}, 2, 5},
		{"source with another digest", 1, func(ws []WorkerInfo) { ws[2].Digest = "other" }, []uint32{0, 5, 8, 0}, 2, 5},
		{"source with another role", 1, func(ws []WorkerInfo) { ws[2].Role = kv.RolePrefill }, []uint32{0, 5, 8, 0}, 2, 5},
		{"source with another model", 1, func(ws []WorkerInfo) { ws[2].Model = "other" }, []uint32{0, 5, 8, 0}, 2, 5},
		{"prefix capped at the request", 1, nil, []uint32{0, 50, 0, 0}, 2, nblocks},
		{"cold target", 4, nil, []uint32{1, 0, 0, 0}, 1, 1},
	} {
		ws := slices.Clone(base)
		if tc.edit != nil {
			tc.edit(ws)
		}
		p := &pool{}
		depth := make([][kv.NumTiers]uint32, len(ws))
		for i := range ws {
			p.workers = append(p.workers, &worker{info: ws[i]})
			depth[i][kv.NumTiers-1] = tc.depth[i]
		}
		plan, ok := planHint(p, int(tc.target-1), depth, nblocks, nil, nil, nil)
		if tc.want == 0 {
			if ok {
				t.Errorf("%s: unexpected hint %+v", tc.name, plan)
			}
			continue
		}
		if !ok || plan.src.Key != key(tc.want) || plan.blocks != tc.n || plan.target != int(tc.depth[tc.target-1]) {
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
	if d.Hint == nil || d.Hint.Source != key(1) || d.Hint.Endpoint != winfo(1).ControlEndpoint || d.Hint.ID != d.ID ||
		!slices.Equal(d.Hint.Hashes, ix.engineHashes(key(1), seq[:12])) || d.Overlap[kv.NumTiers-1] != 0 {
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

// evictingIndex reports matches as fakeIndex does, but its source has
// evicted all but keep blocks by the time the hint's hashes are read.
type evictingIndex struct {
	*fakeIndex
	keep int
}

func (e evictingIndex) EngineHashes(w kv.WorkerKey, local []kv.LocalHash, dst []kv.EngineHash) []kv.EngineHash {
	return e.fakeIndex.EngineHashes(w, local[:min(e.keep, len(local))], dst)
}

// A source that evicted blocks after the match is hinted for what it still
// holds, and not at all when that is no more than the target holds.
func TestHintShrinksToWhatTheSourceStillHolds(t *testing.T) {
	p := prompt(5, 20*testBS)
	seq := seqOf(p)
	for _, tc := range []struct{ keep, want int }{{12, 12}, {5, 5}, {2, 0}, {0, 0}} {
		ix := newFakeIndex()
		ix.store(key(1), kv.TierDevice, seq[:12])
		ix.store(key(2), kv.TierDevice, seq[:2])
		r := newRouter(t, Config{Matcher: evictingIndex{ix, tc.keep}, Hints: true, MaxKVUsage: 0.5}, 1, 2)
		r.UpdateLoad(key(1), 90, 100, 1, 0) // busy: the request goes to worker 2
		d := route(t, r, p)
		if d.Worker != key(2) {
			t.Fatalf("keep %d: routed to %v", tc.keep, d.Worker)
		}
		switch {
		case tc.want == 0 && d.Hint != nil:
			t.Errorf("keep %d: hint %+v, want none", tc.keep, d.Hint)
		case tc.want > 0 && (d.Hint == nil || !slices.Equal(d.Hint.Hashes, ix.engineHashes(key(1), seq[:tc.want]))):
			t.Errorf("keep %d: hint %+v, want worker 1's first %d blocks", tc.keep, d.Hint, tc.want)
		}
		d.Done()
	}
}

type matchOnly struct{ ix *fakeIndex }

func (m matchOnly) FindMatches(local []kv.LocalHash, dst []Match) []Match {
	return m.ix.FindMatches(local, dst)
}

func TestHintsNeedEngineHashes(t *testing.T) {
	if _, err := New(Config{Matcher: matchOnly{newFakeIndex()}, Hints: true}); err == nil {
		t.Fatal("hints over a Matcher without engine hashes accepted")
	}
	if _, err := New(Config{Matcher: matchOnly{newFakeIndex()}}); err != nil {
		t.Fatalf("no hints: %v", err)
	}
}
