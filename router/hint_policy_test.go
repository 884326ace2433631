package router

import (
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

// A HintPolicy sees every eligible source longest first (a peer's host-tier
// prefix counts), and may pick another one, skip, or give an invalid index
// (no hint). Without a policy the longest prefix wins.
func TestHintPolicy(t *testing.T) {
	p := prompt(3, 20*testBS)
	seq := seqOf(p)
	var seen []HintCandidate
	var seenTarget kv.WorkerKey
	answer := 0
	policy := func(target WorkerInfo, targetBlocks int, cands []HintCandidate) int {
		seen, seenTarget = slices.Clone(cands), target.Key
		if targetBlocks != 2 {
			t.Errorf("target blocks %d, want 2", targetBlocks)
		}
		return answer
	}
	for _, tc := range []struct {
		name   string
		policy HintPolicy
		answer int
		want   uint64 // source; 0 = no hint
		n      int
	}{
		{"no policy: longest, host tier included", nil, 0, 1, 12},
		{"default choice", policy, 0, 1, 12},
		{"another source", policy, 2, 2, 6},
		{"skip", policy, HintSkip, 0, 0},
		{"out of range", policy, 3, 0, 0},
	} {
		ix := newFakeIndex()
		ix.store(key(1), kv.TierHost, seq[:12])
		ix.store(key(2), kv.TierDevice, seq[:6])
		ix.store(key(3), kv.TierDevice, seq[:8])
		ix.store(key(4), kv.TierDevice, seq[:2])
		r := newRouter(t, Config{Matcher: ix, Hints: true, HintPolicy: tc.policy, MaxKVUsage: 0.5}, 1, 2, 3, 4)
		for _, w := range []uint64{1, 2, 3} {
			r.UpdateLoad(key(w), 90, 100, 1, 0) // busy: the request goes to worker 4
		}
		answer, seen = tc.answer, nil
		d := route(t, r, p)
		if d.Worker != key(4) {
			t.Fatalf("%s: routed to %v, want worker 4", tc.name, d.Worker)
		}
		if tc.policy != nil {
			want := []HintCandidate{{winfo(1), 12}, {winfo(3), 8}, {winfo(2), 6}}
			if seenTarget != key(4) || len(seen) != 3 || seen[0].Worker.Key != key(1) || seen[0].Blocks != 12 ||
				seen[1].Worker.Key != key(3) || seen[1].Blocks != 8 || seen[2].Worker.Key != key(2) || seen[2].Blocks != 6 {
				t.Errorf("%s: policy saw %+v for %v, want %+v", tc.name, seen, seenTarget, want)
			}
		}
		if tc.want == 0 {
			if d.Hint != nil {
				t.Errorf("%s: unexpected hint %+v", tc.name, d.Hint)
			}
			d.Done()
			continue
		}
		if d.Hint == nil || d.Hint.Source != key(tc.want) || !slices.Equal(d.Hint.SeqHashes, kv.RawHashes(seq[:tc.n])) || d.Hint.TargetBlocks != 2 {
			t.Errorf("%s: hint %+v, want source %d with %d blocks", tc.name, d.Hint, tc.want, tc.n)
		}
		d.Done()
	}
}
