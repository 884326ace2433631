package router

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

const testBS = 16

func key(i uint64) kv.WorkerKey { return kv.WorkerKey{Instance: i} }

func winfo(i uint64) WorkerInfo {
	return WorkerInfo{Key: key(i), Model: "m", BlockSize: testBS, KVBlocks: 1000, MaxBatchedTokens: 8192,
		Digest: "d", ControlEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", 20000+i), HintCapable: true}
}

// prompt returns n deterministic tokens; different seeds share nothing.
func prompt(seed, n int) []kv.Token {
	out := make([]kv.Token, n)
	for i := range out {
		out[i] = kv.Token(seed*1_000_003 + i)
	}
	return out
}

func seqOf(tokens []kv.Token) []kv.SeqHash {
	_, seq := kv.NewHasher(testBS, "", "").Blocks(tokens)
	return seq
}

func newRouter(t testing.TB, cfg Config, workers ...uint64) *Router {
	t.Helper()
	if cfg.Rand == nil {
		cfg.Rand = rand.New(rand.NewPCG(1, 2))
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range workers {
		if err := r.AddWorker(winfo(w)); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

func route(t testing.TB, r *Router, tokens []kv.Token) *Decision {
	t.Helper()
	d, err := r.Route(context.Background(), Request{Model: "m", Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestConfigErrors(t *testing.T) {
	for name, cfg := range map[string]Config{
		"unknown mode":       {Mode: "nearest"},
		"kv without index":   {Mode: ModeKV},
		"negative credit":    {Cost: &CostModel{Device: -1}},
		"NaN temperature":    {Cost: &CostModel{Temperature: math.NaN()}},
		"negative threshold": {MaxKVUsage: -0.5},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
	if _, err := ParseMode("KV-Approx"); err != nil {
		t.Errorf("ParseMode: %v", err)
	}
	if _, err := ParseMode("kv+hints"); err == nil || err.Error() != `unknown router mode "kv+hints" (want round-robin, random, kv or kv-approx)` {
		t.Errorf("ParseMode(kv+hints): %v", err)
	}
}

func TestAddWorkerValidation(t *testing.T) {
	r := newRouter(t, Config{}, 1)
	bad := winfo(2)
	bad.BlockSize = 32
	if err := r.AddWorker(bad); err == nil {
		t.Error("mixed block sizes in one model accepted")
	}
	bad = winfo(3)
	bad.Model = ""
	if err := r.AddWorker(bad); err == nil {
		t.Error("empty model accepted")
	}
	// The only worker of a pool may change its block size.
	only := winfo(1)
	only.BlockSize = 32
	if err := r.AddWorker(only); err != nil {
		t.Errorf("sole worker changing block size: %v", err)
	}
}

func TestNoWorkers(t *testing.T) {
	r := newRouter(t, Config{}, 1)
	_, err := r.Route(context.Background(), Request{Model: "other", Tokens: prompt(1, 64)})
	if !errors.Is(err, kv.ErrNoWorkers) {
		t.Fatalf("unknown model: %v", err)
	}
	_, err = r.Route(context.Background(), Request{Model: "m", Role: kv.RolePrefill, Tokens: prompt(1, 64)})
	if !errors.Is(err, kv.ErrNoWorkers) {
		t.Fatalf("no prefill workers: %v", err)
	}
	_, err = r.Route(context.Background(), Request{Model: "m", Tokens: prompt(1, 64), Exclude: []kv.WorkerKey{key(1)}})
	if !errors.Is(err, kv.ErrNoWorkers) {
		t.Fatalf("all excluded: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.Route(ctx, Request{Model: "m", Tokens: prompt(1, 64)}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: %v", err)
	}
}

func TestKVPrefersPrefixHolder(t *testing.T) {
	ix := newFakeIndex()
	r := newRouter(t, Config{Matcher: ix}, 1, 2, 3, 4)
	p := prompt(7, 640) // 40 blocks
	seq := seqOf(p)
	ix.store(key(3), kv.TierDevice, seq[:30])
	ix.store(key(2), kv.TierHost, seq[:30])
	ix.store(key(4), kv.TierDisk, seq[:40])
	for i := 0; i < 20; i++ {
		d := route(t, r, p)
		if d.Worker != key(3) {
			t.Fatalf("route %d went to %v, want the device holder %v", i, d.Worker, key(3))
		}
		if d.Overlap != [kv.NumTiers]uint32{30, 30, 30, 30} || d.CachedTokens != 30*testBS || d.PrefillTokens != 640-30*testBS {
			t.Fatalf("decision %+v", d)
		}
		d.Done()
	}
	// Without the device holder, the host holder (credit 22.5) beats the
	// disk holder (credit 10).
	r.RemoveWorker(key(3))
	d := route(t, r, p)
	if d.Worker != key(2) {
		t.Fatalf("went to %v, want host holder", d.Worker)
	}
	if tb := d.TierBlocks(); tb != [kv.NumTiers]uint32{0, 30, 0, 0} {
		t.Fatalf("TierBlocks %v", tb)
	}
	d.Done()
	// A prompt nobody holds has no overlap and no predicted cache.
	d = route(t, r, prompt(8, 640))
	if d.CachedTokens != 0 || d.Overlap != [kv.NumTiers]uint32{} {
		t.Fatalf("cold prompt decision %+v", d)
	}
	if len(d.Local) != 40 || len(d.Seq) != 40 || d.Seq[39] != seqOf(prompt(8, 640))[39] {
		t.Fatal("decision hashes do not match the request's")
	}
}

func TestTemperatureZeroTiesAreRandomAndSeeded(t *testing.T) {
	picks := func(seed uint64) []kv.WorkerKey {
		r := newRouter(t, Config{Matcher: newFakeIndex(), Rand: rand.New(rand.NewPCG(seed, 0))}, 1, 2, 3, 4)
		var out []kv.WorkerKey
		for i := 0; i < 400; i++ {
			d := route(t, r, prompt(i, 256))
			out = append(out, d.Worker)
			d.Done()
		}
		return out
	}
	a, b := picks(42), picks(42)
	count := map[kv.WorkerKey]int{}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("same seed diverged at %d", i)
		}
		count[a[i]]++
	}
	for w := uint64(1); w <= 4; w++ {
		if c := count[key(w)]; c < 60 {
			t.Errorf("worker %d won %d of 400 ties; want about 100", w, c)
		}
	}
	if c := picks(43); fmt.Sprint(c) == fmt.Sprint(a) {
		t.Error("different seeds gave the same tie-breaks")
	}
}

func TestTemperatureZeroIsArgMin(t *testing.T) {
	// Load differences alone decide: the idle worker wins every time.
	r := newRouter(t, Config{Matcher: newFakeIndex()}, 1, 2)
	busy := route(t, r, prompt(1, 1024))
	for i := 0; i < 50; i++ {
		d := route(t, r, prompt(100+i, 64))
		if d.Worker == busy.Worker {
			t.Fatalf("route %d picked the loaded worker", i)
		}
		d.Done()
	}
}

func TestSoftmaxDistribution(t *testing.T) {
	ix := newFakeIndex()
	p := prompt(3, 320) // 20 blocks
	seq := seqOf(p)
	ix.store(key(1), kv.TierDevice, seq)      // cost 20 (decode only)
	ix.store(key(2), kv.TierDevice, seq[:10]) // cost 30
	// worker 3 holds nothing: cost 40
	for _, tc := range []struct {
		temp float64
		want [3]float64
	}{
		// p ∝ exp(−x/T) with x = 0, 0.5, 1.
		{1, softmax(1)},
		{0.25, softmax(0.25)},
		{100, softmax(100)},
	} {
		r := newRouter(t, Config{Matcher: ix, Cost: &CostModel{Device: 1, Host: 0.75, Disk: 0.25, PrefillScale: 1, Temperature: tc.temp},
			Rand: rand.New(rand.NewPCG(9, 9))}, 1, 2, 3)
		const n = 20000
		var got [3]float64
		for i := 0; i < n; i++ {
			d := route(t, r, p)
			got[d.Worker.Instance-1]++
			d.Done()
		}
		for i := range got {
			got[i] /= n
			if math.Abs(got[i]-tc.want[i]) > 0.015 {
				t.Errorf("T=%v: worker %d chosen %.3f of the time, want %.3f", tc.temp, i+1, got[i], tc.want[i])
			}
		}
	}
}

func softmax(temp float64) [3]float64 {
	e := [3]float64{1, math.Exp(-0.5 / temp), math.Exp(-1 / temp)}
	s := e[0] + e[1] + e[2]
	return [3]float64{e[0] / s, e[1] / s, e[2] / s}
}

func TestLoadAccounting(t *testing.T) {
	r := newRouter(t, Config{Mode: ModeRoundRobin}, 1)
	p := prompt(5, 100) // 6 full blocks + a 4-token tail
	want := func(step string, prefill, blocks, reqs int64) {
		t.Helper()
		l := r.Load(key(1))
		if l.ActivePrefillTokens != prefill || l.ActiveBlocks != blocks || l.ActiveRequests != reqs {
			t.Fatalf("%s: load %+v, want prefill %d blocks %d requests %d", step, l, prefill, blocks, reqs)
		}
		if math.Abs(l.KVUsage-float64(blocks)/1000) > 1e-12 {
			t.Fatalf("%s: kv usage %v", step, l.KVUsage)
		}
	}
	a := route(t, r, p)
	want("routed", 100, 7, 1)
	a.FirstToken()
	want("first token", 0, 7, 1)
	a.FirstToken()
	want("first token twice", 0, 7, 1)

	// Same prompt again: its 6 full blocks are shared, its tail is not.
	b := route(t, r, p)
	want("second routed", 100, 8, 2)
	// A longer prompt sharing the prefix adds only its new blocks.
	c := route(t, r, append(prompt(5, 100)[:96], prompt(6, 64)...)) // 10 blocks, first 6 shared
	want("third routed", 260, 12, 3)

	b.Done() // cancelled before its first token: prefill goes too
	want("cancelled", 160, 11, 2)
	b.Done()
	b.FirstToken()
	want("cancelled twice", 160, 11, 2)
	a.Done()
	want("first done", 160, 10, 1)
	c.FirstToken()
	c.Done()
	want("all done", 0, 0, 0)
}

func TestBusyThresholds(t *testing.T) {
	clk := newFakeClock()
	r := newRouter(t, Config{Mode: ModeRoundRobin, MaxPrefillTokens: 100, BusyRetryAfter: 3 * time.Second, Now: clk.Now}, 1, 2)
	d1 := route(t, r, prompt(1, 200))
	d2 := route(t, r, prompt(2, 200))
	_, err := r.Route(context.Background(), Request{Model: "m", Tokens: prompt(3, 50)})
	var be *kv.BusyError
	if !errors.Is(err, kv.ErrAllBusy) || !errors.As(err, &be) || be.RetryAfter != 3*time.Second || be.Workers != 2 {
		t.Fatalf("every worker over the prefill threshold: %v", err)
	}
	d2.FirstToken()
	if d := route(t, r, prompt(3, 50)); d.Worker != d2.Worker {
		t.Fatalf("went to %v, want the worker whose prefill finished", d.Worker)
	}
	d1.Done()
	d2.Done()

	// KV usage: reported by the worker, counted while fresh.
	r2 := newRouter(t, Config{Mode: ModeRandom, MaxKVUsage: 0.9, LoadReportTTL: 5 * time.Second, Now: clk.Now}, 1, 2)
	r2.UpdateLoad(key(1), 95, 100, 4, 2)
	for i := 0; i < 30; i++ {
		d := route(t, r2, prompt(i, 64))
		if d.Worker == key(1) {
			t.Fatal("picked a worker reporting 95% KV usage")
		}
		d.Done()
	}
	r2.UpdateLoad(key(2), 99, 100, 4, 2)
	if _, err := r2.Route(context.Background(), Request{Model: "m", Tokens: prompt(1, 64)}); !errors.Is(err, kv.ErrAllBusy) {
		t.Fatalf("both reporting full: %v", err)
	}
	clk.Advance(6 * time.Second) // reports went stale
	route(t, r2, prompt(1, 64)).Done()

	// KV usage estimated by the router itself: 1000-block workers, a
	// 950-block prompt pins one.
	r3 := newRouter(t, Config{Mode: ModeRoundRobin, MaxKVUsage: 0.9, Now: clk.Now}, 1)
	big := route(t, r3, prompt(1, 950*testBS))
	if _, err := r3.Route(context.Background(), Request{Model: "m", Tokens: prompt(2, 64)}); !errors.Is(err, kv.ErrAllBusy) {
		t.Fatalf("estimated usage 95%%: %v", err)
	}
	big.Done()
	route(t, r3, prompt(2, 64))

	// Fraction of max batched tokens.
	r4 := newRouter(t, Config{Mode: ModeRoundRobin, MaxPrefillFrac: 0.5, Now: clk.Now}, 1)
	route(t, r4, prompt(1, 5000)) // > 0.5·8192
	if _, err := r4.Route(context.Background(), Request{Model: "m", Tokens: prompt(2, 64)}); !errors.Is(err, kv.ErrAllBusy) {
		t.Fatalf("prefill fraction: %v", err)
	}
}

func TestRoundRobinCycles(t *testing.T) {
	r := newRouter(t, Config{Mode: ModeRoundRobin}, 3, 1, 2)
	var got []uint64
	for i := 0; i < 7; i++ {
		d := route(t, r, prompt(i, 64))
		got = append(got, d.Worker.Instance)
		d.Done()
	}
	if fmt.Sprint(got) != "[1 2 3 1 2 3 1]" {
		t.Fatalf("round robin order %v", got)
	}
	// A busy or excluded worker is skipped, the cycle continues after it.
	d, err := r.Route(context.Background(), Request{Model: "m", Tokens: prompt(9, 64), Exclude: []kv.WorkerKey{key(2)}})
	if err != nil || d.Worker != key(3) {
		t.Fatalf("exclusion: %v %v", d, err)
	}
	if d := route(t, r, prompt(10, 64)); d.Worker != key(1) {
		t.Fatalf("after skip: %v", d.Worker)
	}
}

func TestRandomModeCoversWorkers(t *testing.T) {
	r := newRouter(t, Config{Mode: ModeRandom}, 1, 2, 3)
	seen := map[kv.WorkerKey]int{}
	for i := 0; i < 300; i++ {
		d := route(t, r, prompt(i, 32))
		seen[d.Worker]++
		d.Done()
	}
	for w := uint64(1); w <= 3; w++ {
		if seen[key(w)] < 60 {
			t.Errorf("worker %d chosen %d of 300 times", w, seen[key(w)])
		}
	}
}

func TestKVApproxLearnsAndExpires(t *testing.T) {
	clk := newFakeClock()
	r := newRouter(t, Config{Mode: ModeKVApprox, NewApprox: newFakeApprox, Now: clk.Now}, 1, 2, 3, 4)
	p := prompt(11, 512)
	first := route(t, r, p)
	first.Done()
	// The router remembers where it sent the prompt.
	for i := 0; i < 10; i++ {
		d := route(t, r, p)
		if d.Worker != first.Worker || d.CachedTokens != 512 {
			t.Fatalf("repeat %d went to %v (cached %d), want %v", i, d.Worker, d.CachedTokens, first.Worker)
		}
		d.Done()
		clk.Advance(10 * time.Second) // each repeat refreshes the TTL
	}
	// 121 s with no traffic for it: the next insert prunes it.
	clk.Advance(121 * time.Second)
	route(t, r, prompt(12, 64)).Done()
	d := route(t, r, p)
	if d.CachedTokens != 0 {
		t.Fatalf("after the TTL the prompt is still predicted cached on %v", d.Worker)
	}
}

func TestRemovedWorkerNeverChosen(t *testing.T) {
	for _, mode := range []Mode{ModeKV, ModeRandom, ModeRoundRobin} {
		ix := newFakeIndex()
		r := newRouter(t, Config{Mode: mode, Matcher: ix}, 1, 2, 3)
		p := prompt(1, 640)
		ix.store(key(2), kv.TierDevice, seqOf(p)) // the index still lists it
		open := route(t, r, p)
		r.RemoveWorker(key(2))
		for i := 0; i < 100; i++ {
			d := route(t, r, p)
			if d.Worker == key(2) {
				t.Fatalf("%s: removed worker chosen", mode)
			}
			d.Done()
		}
		open.Done() // a decision on a removed worker ends harmlessly
		if err := r.AddWorker(winfo(2)); err != nil {
			t.Fatal(err)
		}
		if l := r.Load(key(2)); l.ActiveRequests != 0 || l.ActiveBlocks != 0 {
			t.Fatalf("%s: re-added worker starts with load %+v", mode, l)
		}
	}
}

func TestStaleRequestsExpire(t *testing.T) {
	clk := newFakeClock()
	r := newRouter(t, Config{Mode: ModeRoundRobin, Now: clk.Now}, 1)
	lost := route(t, r, prompt(1, 640)) // its Done never comes
	clk.Advance(2 * time.Hour)
	d := route(t, r, prompt(2, 64))
	if l := r.Load(key(1)); l.ActiveRequests != 1 || l.ActiveBlocks != 4 {
		t.Fatalf("after the sweep: %+v", l)
	}
	lost.Done() // no double free
	d.Done()
	if l := r.Load(key(1)); l.ActiveRequests != 0 || l.ActiveBlocks != 0 || l.ActivePrefillTokens != 0 {
		t.Fatalf("after all done: %+v", l)
	}
}

func TestRolesAreSeparatePools(t *testing.T) {
	r := newRouter(t, Config{Mode: ModeRoundRobin}, 1)
	pf := winfo(9)
	pf.Role = kv.RolePrefill
	if err := r.AddWorker(pf); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		d, err := r.Route(context.Background(), Request{Model: "m", Role: kv.RolePrefill, Tokens: prompt(i, 64)})
		if err != nil || d.Worker != key(9) {
			t.Fatalf("prefill route: %v %v", d, err)
		}
		if d := route(t, r, prompt(i, 64)); d.Worker != key(1) {
			t.Fatalf("aggregated route went to %v", d.Worker)
		}
	}
	if ws := r.Workers("m", ""); len(ws) != 1 || ws[0].Key != key(1) {
		t.Fatalf("aggregated pool %v", ws)
	}
}

func TestConcurrentRoute(t *testing.T) {
	ix := newFakeIndex()
	r := newRouter(t, Config{Matcher: ix, Hints: true, MaxKVUsage: 0.99}, 1, 2, 3, 4)
	for w := uint64(1); w <= 4; w++ {
		ix.store(key(w), kv.TierDevice, seqOf(prompt(int(w), 256)))
	}
	var wg sync.WaitGroup
	for g := 0; g < 6; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 150; i++ {
				d, err := r.Route(context.Background(), Request{Model: "m", Tokens: prompt((g+i)%5, 256+i)})
				if err != nil {
					if errors.Is(err, kv.ErrNoWorkers) || errors.Is(err, kv.ErrAllBusy) {
						continue
					}
					t.Error(err)
					return
				}
				if i%3 == 0 {
					d.FirstToken()
				}
				d.Done()
				d.Done()
			}
		}(g)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 100; i++ {
			r.RemoveWorker(key(4))
			r.UpdateLoad(key(1), i, 1000, 1, 0)
			_ = r.Loads()
			if err := r.AddWorker(winfo(4)); err != nil {
				t.Error(err)
			}
		}
	}()
	wg.Wait()
	for _, l := range r.Loads() {
		if l.ActiveRequests != 0 || l.ActiveBlocks != 0 || l.ActivePrefillTokens != 0 {
			t.Errorf("load left after every Done: %+v", l)
		}
	}
}

func TestRequestCostOverride(t *testing.T) {
	ix := newFakeIndex()
	p := prompt(3, 320)
	ix.store(key(1), kv.TierDevice, seqOf(p))
	// A hot router (T=100, nearly uniform) asked for arg-min per request.
	r := newRouter(t, Config{Matcher: ix, Cost: &CostModel{Device: 1, PrefillScale: 1, Temperature: 100}}, 1, 2, 3)
	argmin := DefaultCost()
	for i := 0; i < 50; i++ {
		d, err := r.Route(context.Background(), Request{Model: "m", Tokens: p, Cost: &argmin})
		if err != nil || d.Worker != key(1) {
			t.Fatalf("override route %d: %v %v", i, d, err)
		}
		d.Done()
	}
	bad := CostModel{Temperature: -1}
	if _, err := r.Route(context.Background(), Request{Model: "m", Tokens: p, Cost: &bad}); err == nil {
		t.Fatal("negative temperature override accepted")
	}
}

func TestNoBlockTracking(t *testing.T) {
	var got []ReplicaEvent
	r := newRouter(t, Config{Mode: ModeRoundRobin, NoBlockTracking: true, OnReplicaEvent: func(ev ReplicaEvent) { got = append(got, ev) }}, 1)
	d := route(t, r, prompt(1, 100))
	if l := r.Load(key(1)); l.ActivePrefillTokens != 100 || l.ActiveBlocks != 0 || l.ActiveRequests != 1 {
		t.Fatalf("load %+v", l)
	}
	if len(d.Seq) != 6 || len(got) != 1 || len(got[0].Blocks) != 0 {
		t.Fatalf("decision keeps its hashes, replica event carries no blocks: %d %+v", len(d.Seq), got)
	}
	d.Done()
	if l := r.Load(key(1)); l != (WorkerLoad{Key: key(1)}) {
		t.Fatalf("after done %+v", l)
	}
}
