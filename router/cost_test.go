package router

import (
	"math"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

func TestCostModelTable(t *testing.T) {
	seq := make([]kv.SeqHash, 4) // a 64-token, 4-block request
	for i := range seq {
		seq[i] = kv.SeqHash(100 + i)
	}
	def := BlockCost()
	for _, tc := range []struct {
		name    string
		model   CostModel
		depth   [kv.NumTiers]uint32
		prefill int64        // worker's active prefill tokens
		active  []kv.SeqHash // worker's active blocks
		private int64        // worker's unshareable active blocks
		want    float64
	}{
		{"cold idle", def, [4]uint32{}, 0, nil, 0, 4 + 4},
		{"device hit", def, [4]uint32{4, 4, 4, 4}, 0, nil, 0, 0 + 4},
		{"host hit", def, [4]uint32{0, 4, 4, 4}, 0, nil, 0, (4 - 3) + 4},
		{"disk hit", def, [4]uint32{0, 0, 4, 4}, 0, nil, 0, (4 - 1) + 4},
		{"object tier only", def, [4]uint32{0, 0, 0, 4}, 0, nil, 0, (4 - 0.4) + 4},
		{"mixed tiers", def, [4]uint32{1, 2, 4, 4}, 0, nil, 0, (4 - (1 + 0.75 + 0.5)) + 4},
		{"active prefill", def, [4]uint32{}, 32, nil, 0, (32+64)/16.0 + 4},
		{"credit over prefill clamps", CostModel{Device: 1, Host: 1, Disk: 1, PrefillScale: 1}, [4]uint32{4, 4, 4, 4}, 0, nil, 0, 0 + 4},
		{"prefill scale", CostModel{Device: 1, PrefillScale: 2}, [4]uint32{2, 2, 2, 2}, 0, nil, 0, 2*2 + 4},
		{"no credit (decode router)", CostModel{PrefillScale: 1}, [4]uint32{4, 4, 4, 4}, 0, nil, 0, 4 + 4},
		{"other active blocks", def, [4]uint32{}, 0, []kv.SeqHash{1, 2, 3}, 2, 4 + (5 + 4)},
		{"shared active prefix", def, [4]uint32{}, 0, []kv.SeqHash{100, 101, 7}, 0, 4 + (3 + 4 - 2)},
		{"request fully active", def, [4]uint32{4, 4, 4, 4}, 16, seq, 0, 1 + 4},
	} {
		l := &load{private: tc.private, prefillTokens: tc.prefill}
		for _, h := range tc.active {
			l.refs.inc(h)
		}
		got := tc.model.cost(tc.depth, l, seq, 64, 64, 16)
		if math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: cost %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestActivePrefixBinarySearch(t *testing.T) {
	seq := []kv.SeqHash{10, 11, 12, 13, 14, 15, 16}
	for n := 0; n <= len(seq); n++ {
		l := &load{}
		l.refs.inc(999)
		for _, h := range seq[:n] {
			l.refs.inc(h)
		}
		if got := l.activePrefix(seq); got != n {
			t.Errorf("prefix %d: got %d", n, got)
		}
	}
}

func TestTierBlocks(t *testing.T) {
	d := Decision{Overlap: [kv.NumTiers]uint32{2, 5, 5, 9}}
	if got := d.TierBlocks(); got != [kv.NumTiers]uint32{2, 3, 0, 4} {
		t.Fatalf("TierBlocks %v", got)
	}
}

// badMatcher reports depths beyond the request and out of tier order.
type badMatcher struct{}

func (badMatcher) FindMatches(local []kv.LocalHash, dst []Match) []Match {
	return append(dst, Match{Worker: key(1), Depth: [kv.NumTiers]uint32{900, 2, 1000, 5}})
}

func TestDepthsAreSanitised(t *testing.T) {
	r := newRouter(t, Config{Matcher: badMatcher{}}, 1)
	d := route(t, r, prompt(1, 64)) // 4 blocks
	if d.Overlap != [kv.NumTiers]uint32{4, 4, 4, 4} || d.CachedTokens != 64 {
		t.Fatalf("overlap %v cached %d", d.Overlap, d.CachedTokens)
	}
}
