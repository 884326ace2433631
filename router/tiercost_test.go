package router

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

func TestTierTimeCostTable(t *testing.T) {
	// The 640-token, 10-block request of TestTimeCostTable on a worker with
	// 100 blocks of KV and a pass budget of 1024 tokens.
	const bs, isl, budget, capacity = 64, 640.0, 1024, 100
	seq := make([]kv.SeqHash, 10)
	for i := range seq {
		seq[i] = kv.SeqHash(500 + i)
	}
	tm := TimeCost()
	host := TierLoad{kv.TierHost: 0.5, kv.TierDisk: 3, kv.TierExternal: 40}
	hostOnly := TierLoad{kv.TierHost: 0.5} // disk and object unknown
	for _, tc := range []struct {
		name      string
		tiers     TierLoad
		depth     [kv.NumTiers]uint32
		prefill   int64   // worker's active prefill tokens
		active    int64   // worker's active (private) blocks
		usage     float64 // reported KV usage
		backlog   float64
		residency float64
		noCharge  bool
		want      float64
	}{
		{"unknown tiers keep the fixed 0.75", TierLoad{}, [4]uint32{0, 4, 4, 4}, 0, 0, 0, 0, 0, false,
			3*poly(640-3*64) + dec(10.0/100)},
		{"known host blocks count in full and add their load", host, [4]uint32{0, 4, 4, 4}, 0, 0, 0, 0, 0, false,
			3*poly(640-4*64) + dec(10.0/100) + 4*0.5},
		{"device blocks load nothing", host, [4]uint32{4, 4, 4, 4}, 0, 0, 0, 0, 0, false,
			3*poly(640-4*64) + dec(10.0/100)},
		{"host then disk then object", host, [4]uint32{1, 3, 6, 10}, 0, 0, 0, 0, 0, false,
			dec(10.0/100) + 2*0.5 + 3*3 + 4*40},
		{"unknown disk keeps its 0.25 beside a known host", hostOnly, [4]uint32{0, 4, 8, 8}, 0, 0, 0, 0, 0, false,
			3*poly(640-5*64) + dec(10.0/100) + 4*0.5},
		{"the load queues behind the channel's backlog", host, [4]uint32{0, 4, 4, 4}, 0, 0, 0, 30, 0, false,
			3*poly(640-4*64) + dec(10.0/100) + 4*0.5 + 30},
		{"a backlog alone costs nothing when nothing loads", host, [4]uint32{4, 4, 4, 4}, 0, 0, 0, 30, 0, false,
			3*poly(640-4*64) + dec(10.0/100)},
		{"queued prefill hides the load", host, [4]uint32{0, 4, 4, 4}, 2000, 0, 0, 30, 0, false,
			// 2000 + 384 tokens: 1024 + 1024 + 336; the 2 + 30 ms load
			// lands while the 2000 queued tokens compute.
			2*poly(1024) + poly(336) + 2*poly(384) + 3*dec(10.0/100)},
		{"queued prefill hides part of the load", host, [4]uint32{0, 4, 4, 4}, 200, 0, 0, 100, 0, false,
			poly(584) + 2*poly(384) + dec(10.0/100) + 102 - poly(200)},
		{"a decode leg waits for no load", host, [4]uint32{0, 4, 4, 4}, 0, 0, 0, 30, 0, true,
			dec(10.0 / 100)},
		{"KV that does not fit waits for requests to leave", host, [4]uint32{}, 0, 95, 0, 0, 1000, false,
			// 95 blocks in use + 10 new > 100: 5 of the 95 must free,
			// a residency of 1000 ms frees 95.
			3*poly(640) + dec(1) + 1000*5.0/95},
		{"a fuller report raises the wait", host, [4]uint32{}, 0, 95, 0.99, 0, 1000, false,
			3*poly(640) + dec(1) + 1000*9.0/99},
		{"the report counts where the router knows fewer blocks", host, [4]uint32{}, 0, 4, 0.99, 0, 1000, false,
			3*poly(640) + dec(0.99) + 1000*9.0/99},
		{"no residency observed yet: no wait", host, [4]uint32{}, 0, 95, 0, 0, 0, false,
			3*poly(640) + dec(1)},
		{"a fitting request waits for nothing", host, [4]uint32{}, 0, 80, 0, 0, 1000, false,
			3*poly(640) + dec(90.0/100)},
		{"device-only workers (no tier timing) keep today's model", TierLoad{}, [4]uint32{}, 0, 95, 0, 0, 1000, false,
			3*poly(640) + dec(1)},
	} {
		l := &load{private: tc.active, prefillTokens: tc.prefill, residencyMS: tc.residency}
		in := costInput{depth: tc.depth, load: l, timing: defaultTiming(), budget: budget,
			kvCap: capacity, usage: tc.usage, blockSz: bs, tierMS: tc.tiers, backlogMS: tc.backlog, noCharge: tc.noCharge}
		got := tm.timeCost(&in, seq, isl)
		if math.Abs(got-tc.want) > 1e-9*max(1, math.Abs(tc.want)) {
			t.Errorf("%s: cost %v, want %v", tc.name, got, tc.want)
		}
	}

	// The clamp: a request larger than what is held waits one residency.
	l := &load{private: 2, residencyMS: 1000}
	in := costInput{load: l, timing: defaultTiming(), budget: budget, kvCap: 5, blockSz: bs, tierMS: host}
	if got := admitWait(&in, seq, isl); got != 1000 {
		t.Errorf("over-capacity request waits %v ms, want one residency (1000)", got)
	}
}

func TestTierLoadRouting(t *testing.T) {
	idx := newFakeIndex()
	clk := newFakeClock()
	r := newRouter(t, Config{Matcher: idx, Now: clk.Now}, 1, 2)
	p := prompt(3, 64*testBS) // 1024 tokens, all held by worker 1's host tier
	idx.store(key(1), kv.TierHost, seqOf(p))
	pick := func() kv.WorkerKey {
		t.Helper()
		d := route(t, r, p)
		d.Done()
		return d.Worker
	}
	setTiers := func(tl TierLoad) {
		t.Helper()
		w := winfo(1)
		w.TierLoad = tl
		if err := r.AddWorker(w); err != nil {
			t.Fatal(err)
		}
	}
	// Fixed credit (tier timing unknown): 0.75 of the prompt is worth it.
	if w := pick(); w != key(1) {
		t.Fatalf("fixed host credit: routed to %v", w)
	}
	// A fast host tier: loading 64 blocks beats recomputing 1024 tokens.
	setTiers(TierLoad{kv.TierHost: 0.2})
	if w := pick(); w != key(1) {
		t.Fatalf("fast host tier: routed to %v", w)
	}
	// A backed-up onboarding channel makes the cold worker cheaper…
	r.UpdateOnboarding(key(1), 300*time.Millisecond)
	if w := pick(); w != key(2) {
		t.Fatalf("backed-up channel: routed to %v", w)
	}
	// …until it drains.
	clk.Advance(280 * time.Millisecond)
	if w := pick(); w != key(1) {
		t.Fatalf("drained channel: routed to %v", w)
	}
	// A tier slower to load than recomputing is worth nothing.
	setTiers(TierLoad{kv.TierHost: 5})
	if w := pick(); w != key(2) {
		t.Fatalf("slow tier: routed to %v", w)
	}
	r.UpdateOnboarding(kv.WorkerKey{Instance: 99}, time.Second) // unknown: ignored
}

func TestResidencyObservedAtDone(t *testing.T) {
	clk := newFakeClock()
	r := newRouter(t, Config{Matcher: newFakeIndex(), Now: clk.Now}, 1)
	for _, d := range []time.Duration{2 * time.Second, 4 * time.Second} {
		dec := route(t, r, prompt(1, 100))
		clk.Advance(d)
		dec.Done()
		dec.Done() // a second Done observes nothing
	}
	want := 2000 + (4000-2000)*residencyAlpha
	if got := r.workers[key(1)].load.residencyMS; math.Abs(got-want) > 1e-9 {
		t.Fatalf("residency %v ms, want %v", got, want)
	}
}

func TestTierLoadValidation(t *testing.T) {
	r := newRouter(t, Config{Matcher: newFakeIndex()})
	for _, v := range []float64{-1, math.NaN(), math.Inf(1)} {
		w := winfo(1)
		w.TierLoad[kv.TierDisk] = v
		if err := r.AddWorker(w); err == nil || !strings.Contains(err.Error(), "disk") {
			t.Errorf("disk load %v: err %v, want one naming the tier", v, err)
		}
	}
}

func TestParseTierLoad(t *testing.T) {
	for in, want := range map[string]TierLoad{
		"":                                {},
		"host=0.168":                      {kv.TierHost: 0.168},
		" host = 0.2 , disk=1.2,object=3": {kv.TierHost: 0.2, kv.TierDisk: 1.2, kv.TierExternal: 3},
		"EXTERNAL=2.5":                    {kv.TierExternal: 2.5},
	} {
		if got, err := ParseTierLoad(in); err != nil || got != want {
			t.Errorf("%q: %v %v, want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"host", "host=", "host=0", "host=-1", "host=NaN", "host=Inf", "gpu=1", "device=1",
		"host=1,host=2", "nvme=1", "host=1,"} {
		if got, err := ParseTierLoad(in); err == nil {
			t.Errorf("%q: accepted as %v", in, got)
		}
	}
}
