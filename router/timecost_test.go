package router

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

// poly and dec are the default timing written out, so the table below
// checks the formula rather than reusing the code under test.
func poly(x float64) float64 {
	if x <= 0 {
		return 0
	}
	return 4.209989e-07*x*x + 1.518344e-02*x + 16.50142
}

func dec(p float64) float64 {
	p = min(max(p, 0), 1)
	return max(1, -25.74*p*p+54.01*p+5.74)
}

func TestTimeCostTable(t *testing.T) {
	// A 640-token request of 10 blocks × 64 tokens on a worker with 100
	// blocks of KV and a pass budget of 1024 tokens.
	const bs, isl, budget, capacity = 64, 640.0, 1024, 100
	seq := make([]kv.SeqHash, 10)
	for i := range seq {
		seq[i] = kv.SeqHash(500 + i)
	}
	tm := TimeCost()
	pure := tm
	pure.WorkWeight = 0
	for _, tc := range []struct {
		name    string
		model   CostModel
		depth   [kv.NumTiers]uint32
		prefill int64        // worker's active prefill tokens
		active  []kv.SeqHash // worker's active blocks
		private int64
		usage   float64 // reported KV usage
		kvCap   int
		want    float64
	}{
		{"cold idle", pure, [4]uint32{}, 0, nil, 0, 0, capacity,
			poly(640) + dec(10.0/100)},
		{"cold idle, work weight 2", tm, [4]uint32{}, 0, nil, 0, 0, capacity,
			poly(640) + 2*poly(640) + dec(10.0/100)},
		{"half cached on device", tm, [4]uint32{5, 5, 5, 5}, 0, nil, 0, 0, capacity,
			3*poly(320) + dec(10.0/100)},
		{"host credit 0.75", tm, [4]uint32{0, 4, 4, 4}, 0, nil, 0, 0, capacity,
			3*poly(640-3*64) + dec(10.0/100)},
		{"disk credit 0.25", tm, [4]uint32{0, 0, 4, 4}, 0, nil, 0, 0, capacity,
			3*poly(640-64) + dec(10.0/100)},
		{"object tier credit 0.1", tm, [4]uint32{0, 0, 0, 10}, 0, nil, 0, 0, capacity,
			3*poly(640-64) + dec(10.0/100)},
		{"fully cached: one decode pass", tm, [4]uint32{10, 10, 10, 10}, 0, nil, 0, 0, capacity,
			dec(10.0 / 100)},
		{"queued prefill spans passes", pure, [4]uint32{}, 2000, nil, 0, 0, capacity,
			// 2640 tokens in chunks of 1024: 1024 + 1024 + 592, three passes.
			2*poly(1024) + poly(592) + 3*dec(10.0/100)},
		{"queued prefill, work weight counts only own", tm, [4]uint32{}, 2000, nil, 0, 0, capacity,
			2*poly(1024) + poly(592) + 2*poly(640) + 3*dec(10.0/100)},
		{"prefill scale", CostModel{Kind: CostTime, Device: 1, PrefillScale: 3}, [4]uint32{}, 0, nil, 0, 0, capacity,
			3*poly(640) + dec(10.0/100)},
		{"active blocks raise decode", pure, [4]uint32{}, 0, []kv.SeqHash{1, 2, 3}, 7, 0, capacity,
			poly(640) + dec(20.0/100)},
		{"shared active prefix not double counted", pure, [4]uint32{}, 0, seq[:4], 0, 0, capacity,
			poly(640) + dec(10.0/100)},
		{"fresher report dominates", pure, [4]uint32{}, 0, nil, 0, 0.6, capacity,
			poly(640) + dec(0.6)},
		{"estimate dominates report", pure, [4]uint32{}, 0, nil, 0, 0.01, capacity,
			poly(640) + dec(10.0/100)},
		{"unknown capacity uses report", pure, [4]uint32{}, 0, nil, 0, 0.3, 0,
			poly(640) + dec(0.3)},
		{"unknown capacity no report", pure, [4]uint32{}, 0, nil, 0, 0, 0,
			poly(640) + dec(0)},
		{"over capacity clamps", pure, [4]uint32{}, 0, nil, 500, 0, capacity,
			poly(640) + dec(1)},
	} {
		l := &load{private: tc.private, prefillTokens: tc.prefill}
		for _, h := range tc.active {
			l.refs.inc(h)
		}
		in := costInput{depth: tc.depth, load: l, timing: defaultTiming(), budget: budget,
			kvCap: tc.kvCap, usage: tc.usage, blockSz: bs}
		got := tc.model.timeCost(&in, seq, isl)
		if math.Abs(got-tc.want) > 1e-9*max(1, math.Abs(tc.want)) {
			t.Errorf("%s: cost %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestTimeCostMonotone(t *testing.T) {
	const bs = 64
	seq := make([]kv.SeqHash, 200) // 12,800 tokens: several 8192-token passes with a queue
	for i := range seq {
		seq[i] = kv.SeqHash(1000 + i)
	}
	isl := float64(len(seq) * bs)
	for _, m := range []CostModel{TimeCost(), {Kind: CostTime, Device: 1, PrefillScale: 1}} {
		cost := func(cached uint32, queued int64, usage float64) float64 {
			in := costInput{depth: [4]uint32{cached, cached, cached, cached}, load: &load{prefillTokens: queued},
				timing: defaultTiming(), budget: 8192, kvCap: 16384, usage: usage, blockSz: bs}
			return m.timeCost(&in, seq, isl)
		}
		for _, q := range []int64{0, 100, 5000, 40000} {
			prev := math.Inf(1)
			for c := uint32(0); c <= uint32(len(seq)); c++ {
				got := cost(c, q, 0.2)
				if got > prev {
					t.Fatalf("work weight %v, queue %d: cost rises from %v to %v at %d cached blocks", m.WorkWeight, q, prev, got, c)
				}
				prev = got
			}
		}
		for _, c := range []uint32{0, 50, 199, 200} {
			prev := math.Inf(-1)
			for q := int64(0); q <= 60000; q += 97 {
				got := cost(c, q, 0.2)
				if got < prev {
					t.Fatalf("work weight %v, %d cached: cost falls from %v to %v at %d queued tokens", m.WorkWeight, c, prev, got, q)
				}
				prev = got
			}
		}
		// Up to the decode curve's peak (p ≈ 1.05, so all of [0, 1]).
		prev := math.Inf(-1)
		for u := 0.0; u <= 1; u += 0.01 {
			if got := cost(50, 1000, u); got < prev {
				t.Fatalf("cost falls with KV usage at %v", u)
			} else {
				prev = got
			}
		}
		// A cache hit is worth more on a long prompt (superlinear prefill).
		short, long := cost(0, 0, 0)-cost(10, 0, 0), 0.0
		in := costInput{depth: [4]uint32{}, load: &load{}, timing: defaultTiming(), budget: 1 << 20, kvCap: 16384, blockSz: bs}
		full := m.timeCost(&in, seq, isl)
		in.depth = [4]uint32{10, 10, 10, 10}
		long = full - m.timeCost(&in, seq, isl)
		in.depth = [4]uint32{}
		small := m.timeCost(&in, seq[:20], 20*bs)
		in.depth = [4]uint32{10, 10, 10, 10}
		smallHit := small - m.timeCost(&in, seq[:20], 20*bs)
		if !(long > smallHit) || !(short > 0) {
			t.Fatalf("10 cached blocks save %v ms on 200 blocks, %v on 20 (chunked %v)", long, smallHit, short)
		}
	}
}

func TestPrefillWork(t *testing.T) {
	tm := DefaultEngineTiming()
	for _, tc := range []struct {
		tokens float64
		budget int
		ms     float64
		passes int
	}{
		{0, 8192, 0, 0},
		{-5, 8192, 0, 0},
		{1, 8192, poly(1), 1},
		{8192, 8192, poly(8192), 1},
		{8193, 8192, poly(8192) + poly(1), 2},
		{3 * 8192, 8192, 3 * poly(8192), 3},
		{20000, 0, poly(20000), 1}, // no budget: one pass
	} {
		ms, passes := tm.PrefillWork(tc.tokens, tc.budget)
		if math.Abs(ms-tc.ms) > 1e-9 || passes != tc.passes {
			t.Errorf("PrefillWork(%v, %d) = %v, %d; want %v, %d", tc.tokens, tc.budget, ms, passes, tc.ms, tc.passes)
		}
	}
	// The mocker's reference values (research/benchmarks.md §4.3).
	for x, want := range map[float64]float64{128: 18.5, 1024: 32.5, 8192: 169.1, 32768: 966.1} {
		if got := tm.PrefillMS(x); math.Abs(got-want) > 0.05 {
			t.Errorf("PrefillMS(%v) = %.2f, want %.1f", x, got, want)
		}
	}
	for p, want := range map[float64]float64{0: 5.74, 0.25: 17.63, 0.5: 26.31, 1: 34.01} {
		if got := tm.DecodeMS(p); math.Abs(got-want) > 0.01 {
			t.Errorf("DecodeMS(%v) = %.2f, want %.2f", p, got, want)
		}
	}
}

func TestParseCostKind(t *testing.T) {
	for in, want := range map[string]CostKind{"blocks": CostBlocks, " Time ": CostTime, "TIME": CostTime} {
		if got, err := ParseCostKind(in); err != nil || got != want {
			t.Errorf("ParseCostKind(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseCostKind("latency"); err == nil {
		t.Error("ParseCostKind accepted latency")
	}
	for k, want := range map[CostKind]CostKind{"": DefaultCost().Kind, CostBlocks: CostBlocks, CostTime: CostTime} {
		if c, err := CostByKind(k); err != nil || c.Kind != want {
			t.Errorf("CostByKind(%q) = %+v, %v", k, c, err)
		}
	}
	if _, err := CostByKind("Time"); err == nil {
		t.Error("CostByKind accepted an unnormalised kind")
	}
}

func TestCostConfigValidation(t *testing.T) {
	for _, c := range []CostModel{
		{Kind: "latency", PrefillScale: 1},
		{Kind: CostTime, PrefillScale: 1, WorkWeight: -1},
		{Kind: CostTime, PrefillScale: 1, WorkWeight: math.Inf(1)},
		{Kind: CostTime, PrefillScale: math.NaN()},
	} {
		if _, err := New(Config{Matcher: newFakeIndex(), Cost: &c}); !errors.Is(err, errConfig) {
			t.Errorf("cost %+v: err %v", c, err)
		}
		r := newRouter(t, Config{Matcher: newFakeIndex()}, 1)
		if _, err := r.Route(context.Background(), Request{Model: "m", Tokens: prompt(1, 32), Cost: &c}); err == nil {
			t.Errorf("request override %+v accepted", c)
		}
	}
	r := newRouter(t, Config{Matcher: newFakeIndex()})
	for _, tm := range []EngineTiming{
		{Prefill: [3]float64{-1, 0.01, 10}, Decode: [3]float64{0, 0, 5}},
		{Prefill: [3]float64{0, math.NaN(), 10}},
		{Prefill: [3]float64{0, 0.01, 10}, DecodeFloor: -1},
	} {
		wi := winfo(1)
		wi.Timing = tm
		if err := r.AddWorker(wi); err == nil {
			t.Errorf("timing %+v accepted", tm)
		}
	}
}

// TestTimeCostRouting checks the time model's decisions end to end: a long
// cached prefix wins over an idle worker, a deep enough queue on the cached
// worker sends the request elsewhere, and per-worker timing is honoured.
func TestTimeCostRouting(t *testing.T) {
	ctx := context.Background()
	idx := newFakeIndex()
	cost := TimeCost()
	r := newRouter(t, Config{Matcher: idx, Cost: &cost}, 1, 2)
	p := prompt(7, 64*testBS) // 1024 tokens
	idx.store(key(1), kv.TierDevice, seqOf(p)[:48])
	if d := route(t, r, p); d.Worker != key(1) || d.CachedTokens != 48*testBS {
		t.Fatalf("cached prefix: routed to %v (cached %d)", d.Worker, d.CachedTokens)
	} else {
		d.Done()
	}
	// Book a long prefill on worker 1: the same request now waits less on 2.
	long, err := r.Route(ctx, Request{Model: "m", Tokens: prompt(8, 9000), Exclude: []kv.WorkerKey{key(2)}})
	if err != nil || long.Worker != key(1) {
		t.Fatalf("booking: %v %v", long, err)
	}
	if d := route(t, r, p); d.Worker != key(2) {
		t.Fatalf("queued worker chosen: %v", d.Worker)
	} else {
		d.Done()
	}
	long.FirstToken() // its prefill is done: the cache wins again
	if d := route(t, r, p); d.Worker != key(1) {
		t.Fatalf("after first token: routed to %v", d.Worker)
	} else {
		d.Done()
	}
	long.Done()

	// Same cache, same load: a worker declared ten times slower at prefill
	// loses to the fast one even with 48 of 64 blocks cached.
	slow := winfo(1)
	slow.Timing = DefaultEngineTiming()
	for i := range slow.Timing.Prefill {
		slow.Timing.Prefill[i] *= 10
	}
	if err := r.AddWorker(slow); err != nil {
		t.Fatal(err)
	}
	if d := route(t, r, p); d.Worker != key(2) {
		t.Fatalf("slow worker chosen: %v", d.Worker)
	} else {
		d.Done()
	}

	// A per-request override back to the block model still works.
	blocks := BlockCost()
	d, err := r.Route(ctx, Request{Model: "m", Tokens: p, Cost: &blocks})
	if err != nil || d.Worker != key(1) {
		t.Fatalf("block override: %v %v", d, err)
	}
	d.Done()
}

// defaultTiming is a fresh DefaultEngineTiming for a costInput.
func defaultTiming() *EngineTiming {
	t := DefaultEngineTiming()
	return &t
}
