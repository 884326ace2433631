package router

import (
	"context"
	"errors"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

func TestDecideDisagg(t *testing.T) {
	def := DisaggConfig{}
	for _, tc := range []struct {
		name string
		cfg  DisaggConfig
		in   DisaggInput
		path DisaggPath
		why  LocalReason
		net  int
	}{
		{"short cold prompt: ratio 1", def, DisaggInput{PromptTokens: 1000}, PathDisagg, "", 1000},
		{"short and mostly cached", def, DisaggInput{PromptTokens: 1000, DecodeCached: 600}, PathLocalPrefill, ReasonISL, 400},
		{"ratio bound is strict", def, DisaggInput{PromptTokens: 1000, DecodeCached: 300}, PathDisagg, "", 700},
		{"just under the ratio", def, DisaggInput{PromptTokens: 1000, DecodeCached: 301}, PathLocalPrefill, ReasonISL, 699},
		{"long net new", def, DisaggInput{PromptTokens: 10000, DecodeCached: 7000}, PathDisagg, "", 3000},
		{"token bound is strict", def, DisaggInput{PromptTokens: 10000, DecodeCached: 7952}, PathDisagg, "", 2048},
		{"just under the token bound", def, DisaggInput{PromptTokens: 10000, DecodeCached: 7953}, PathLocalPrefill, ReasonISL, 2047},
		{"fully cached", def, DisaggInput{PromptTokens: 5000, DecodeCached: 5000}, PathLocalPrefill, ReasonISL, 0},
		{"cache over prompt is capped", def, DisaggInput{PromptTokens: 100, DecodeCached: 900}, PathLocalPrefill, ReasonISL, 0},
		{"empty prompt", def, DisaggInput{}, PathLocalPrefill, ReasonISL, 0},
		{"prefill busy", def, DisaggInput{PromptTokens: 10000, PrefillBusy: true}, PathLocalPrefill, ReasonPrefillBusy, 10000},
		{"isl wins over busy", def, DisaggInput{PromptTokens: 1000, DecodeCached: 900, PrefillBusy: true}, PathLocalPrefill, ReasonISL, 100},
		{"busy bypass off", DisaggConfig{NoBusyBypass: true}, DisaggInput{PromptTokens: 10000, PrefillBusy: true}, PathDisagg, "", 10000},
		{"length rule off", DisaggConfig{LocalPrefillTokens: -1}, DisaggInput{PromptTokens: 1000, DecodeCached: 999}, PathDisagg, "", 1},
		{"decode-only pool: never local", def, DisaggInput{PromptTokens: 1000, DecodeCached: 900, PrefillBusy: true, DecodeOnly: true}, PathDisagg, "", 100},
		{"custom bounds", DisaggConfig{LocalPrefillTokens: 100, LocalPrefillRatio: 1}, DisaggInput{PromptTokens: 99, DecodeCached: 1}, PathLocalPrefill, ReasonISL, 98},
	} {
		got := DecideDisagg(tc.cfg, tc.in)
		if got.Path != tc.path || got.Reason != tc.why || got.NetNew != tc.net {
			t.Errorf("%s: %+v, want %s/%q net %d", tc.name, got, tc.path, tc.why, tc.net)
		}
	}
	for _, bad := range []float64{-0.1, 1.5} {
		if err := (DisaggConfig{LocalPrefillRatio: bad}).Validate(); err == nil {
			t.Errorf("ratio %v accepted", bad)
		}
	}
	if err := (DisaggConfig{}).Validate(); err != nil {
		t.Error(err)
	}
}

func roleInfo(i uint64, role kv.Role) WorkerInfo {
	w := winfo(i)
	w.Role = role
	return w
}

// pdRouter has prefill workers 1, 2 and decode workers 3, 4.
func pdRouter(t *testing.T, ix *fakeIndex, cfg Config) *Router {
	t.Helper()
	cfg.Matcher, cfg.Hints = ix, true
	r := newRouter(t, cfg)
	for i, role := range []kv.Role{kv.RolePrefill, kv.RolePrefill, kv.RoleDecode, kv.RoleDecode} {
		if err := r.AddWorker(roleInfo(uint64(i+1), role)); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

func TestPeekBooksNothing(t *testing.T) {
	ix := newFakeIndex()
	r := pdRouter(t, ix, Config{})
	p := prompt(1, 20*testBS)
	seq := seqOf(p)
	ix.store(key(2), kv.TierDevice, seq[:12])
	ix.store(key(1), kv.TierDevice, seq[:3])
	ctx := context.Background()
	req := Request{Model: "m", Tokens: p}
	pk, err := r.Peek(ctx, PrefillLegRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	if pk.Worker != key(2) || pk.CachedTokens != 12*testBS || pk.PrefillTokens != 8*testBS || pk.Hint != nil {
		t.Fatalf("peek %+v", pk)
	}
	for _, k := range []uint64{1, 2, 3, 4} {
		if l := r.Load(key(k)); l.ActiveRequests != 0 || l.ActivePrefillTokens != 0 || l.ActiveBlocks != 0 {
			t.Fatalf("peek booked load on %d: %+v", k, l)
		}
	}
	pk.Done() // a peek has no handle: harmless
	d, err := r.Route(ctx, PrefillLegRequest(req))
	if err != nil || d.Worker != pk.Worker || d.CachedTokens != pk.CachedTokens {
		t.Fatalf("route after peek: %+v %v", d, err)
	}
	// The chosen worker holds the most: no hint.
	if d.Hint != nil {
		t.Fatalf("hint %+v", d.Hint)
	}
	if l := r.Load(key(2)); l.ActiveRequests != 1 || l.ActivePrefillTokens != 8*testBS {
		t.Fatalf("route booked %+v", l)
	}
	d.Done()

	// Round-robin: peeking does not advance the cursor.
	rr := newRouter(t, Config{Mode: ModeRoundRobin}, 1, 2, 3)
	for range 3 {
		if d, _ := rr.Peek(ctx, Request{Model: "m", Tokens: p}); d.Worker != key(1) {
			t.Fatalf("peek moved the round-robin cursor: %v", d.Worker)
		}
	}
	if d := route(t, rr, p); d.Worker != key(1) {
		t.Fatalf("first route after peeks went to %v", d.Worker)
	}
}

// A decode leg goes by load alone: the worker holding the prompt earns no
// credit, the decision reports no overlap and no hint, and nothing is
// booked as prefill.
func TestDecodeLegByLoad(t *testing.T) {
	for _, cm := range []CostModel{BlockCost(), TimeCost()} {
		ix := newFakeIndex()
		r := pdRouter(t, ix, Config{Cost: &cm})
		p := prompt(1, 40*testBS)
		seq := seqOf(p)
		ix.store(key(3), kv.TierDevice, seq) // decode worker 3 holds it all
		ctx := context.Background()
		// Load worker 3 a little with a decode leg of another prompt.
		other, err := r.Route(ctx, DecodeLegRequest(Request{Model: "m", Tokens: prompt(2, 10*testBS), Exclude: []kv.WorkerKey{key(4)}}))
		if err != nil {
			t.Fatal(err)
		}
		if other.Worker != key(3) || other.PrefillTokens != 0 || other.CachedTokens != 0 || other.Hint != nil {
			t.Fatalf("%s: decode leg decision %+v", cm.Kind, other)
		}
		if l := r.Load(key(3)); l.ActivePrefillTokens != 0 || l.ActiveBlocks != 10 || l.ActiveRequests != 1 {
			t.Fatalf("%s: decode leg booked %+v", cm.Kind, l)
		}
		// The full prompt as a decode leg goes to the idle decode worker
		// although worker 3 holds the prompt: no overlap credit.
		d, err := r.Route(ctx, DecodeLegRequest(Request{Model: "m", Tokens: p}))
		if err != nil {
			t.Fatal(err)
		}
		if d.Worker != key(4) || d.Overlap != ([kv.NumTiers]uint32{}) || d.Hint != nil || d.PrefillTokens != 0 {
			t.Fatalf("%s: decode leg went to %v overlap %v hint %+v prefill %d", cm.Kind, d.Worker, d.Overlap, d.Hint, d.PrefillTokens)
		}
		if l := r.Load(key(4)); l.ActivePrefillTokens != 0 || l.ActiveBlocks != 40 {
			t.Fatalf("%s: decode leg booked %+v", cm.Kind, l)
		}
		d.Done()
		// As a local prefill the same request follows its cache to worker
		// 3 despite its load, and is charged for what it computes.
		lp, err := r.Route(ctx, LocalPrefillRequest(Request{Model: "m", Tokens: p}))
		if err != nil || lp.Worker != key(3) || lp.CachedTokens != 40*testBS {
			t.Fatalf("%s: local prefill %+v %v", cm.Kind, lp, err)
		}
		lp.Done()
		other.Done()
	}
}

func TestPlanDisagg(t *testing.T) {
	ctx := context.Background()
	long := prompt(1, 200*testBS) // 3200 tokens
	seq := seqOf(long)
	for _, tc := range []struct {
		name    string
		cfg     Config
		decHeld int  // blocks decode worker 3 holds
		load    bool // prefill workers over the busy threshold
		path    DisaggPath
		why     LocalReason
	}{
		{"cold long prompt", Config{}, 0, false, PathDisagg, ""},
		{"decode holds most", Config{}, 150, false, PathLocalPrefill, ReasonISL},
		{"decode holds a little", Config{}, 50, false, PathDisagg, ""},
		{"prefill pool busy", Config{MaxPrefillTokens: 100}, 0, true, PathLocalPrefill, ReasonPrefillBusy},
	} {
		ix := newFakeIndex()
		r := pdRouter(t, ix, tc.cfg)
		ix.store(key(3), kv.TierDevice, seq[:tc.decHeld])
		if tc.load {
			for _, w := range []uint64{1, 2} {
				if _, err := r.Route(ctx, PrefillLegRequest(Request{Model: "m", Tokens: prompt(int(10+w), 20*testBS), Exclude: []kv.WorkerKey{key(3 - w)}})); err != nil {
					t.Fatal(err)
				}
			}
		}
		got, err := r.PlanDisagg(ctx, Request{Model: "m", Tokens: long}, DisaggConfig{})
		if err != nil || got.Path != tc.path || got.Reason != tc.why {
			t.Errorf("%s: %+v %v, want %s/%q", tc.name, got, err, tc.path, tc.why)
		}
	}
	// A model without a decode pool cannot be planned.
	r := newRouter(t, Config{}, 1)
	if _, err := r.PlanDisagg(ctx, Request{Model: "m", Tokens: long}, DisaggConfig{}); !errors.Is(err, kv.ErrNoWorkers) {
		t.Fatalf("no decode pool: %v", err)
	}
}

// A decode worker that cannot prefill alone (SGLang's) takes decode legs
// only: no local prefill and no whole request, even when it holds the whole
// prompt or the prefill pool is busy; a capable decode worker beside it
// still takes them, with the decode-only one as its hint source.
func TestDecodeOnlyWorkers(t *testing.T) {
	ctx := context.Background()
	long := prompt(1, 200*testBS)
	seq := seqOf(long)
	// pd has prefill workers 1, 2 and decode-only worker 3; worker 4 is a
	// decode worker, decode-only unless capable.
	pd := func(cfg Config, capable bool) (*Router, *fakeIndex) {
		ix := newFakeIndex()
		cfg.Matcher, cfg.Hints = ix, true
		r := newRouter(t, cfg)
		for i, role := range []kv.Role{kv.RolePrefill, kv.RolePrefill, kv.RoleDecode, kv.RoleDecode} {
			w := roleInfo(uint64(i+1), role)
			w.DecodeOnly = role == kv.RoleDecode && !(capable && i == 3)
			if err := r.AddWorker(w); err != nil {
				t.Fatal(err)
			}
		}
		return r, ix
	}
	req := Request{Model: "m", Tokens: long}
	for _, tc := range []struct {
		name string
		cfg  Config
		load bool
	}{
		{"decode holds the whole prompt", Config{}, false},
		{"prefill pool busy", Config{MaxPrefillTokens: 100}, true},
	} {
		r, ix := pd(tc.cfg, false)
		ix.store(key(3), kv.TierDevice, seq)
		ix.store(key(4), kv.TierDevice, seq)
		if tc.load {
			for _, w := range []uint64{1, 2} {
				if _, err := r.Route(ctx, PrefillLegRequest(Request{Model: "m", Tokens: prompt(int(10+w), 20*testBS), Exclude: []kv.WorkerKey{key(3 - w)}})); err != nil {
					t.Fatal(err)
				}
			}
		}
		got, err := r.PlanDisagg(ctx, req, DisaggConfig{})
		if err != nil || got.Path != PathDisagg {
			t.Errorf("%s: planned %+v %v, want %s", tc.name, got, err, PathDisagg)
		}
		for name, whole := range map[string]Request{"local prefill": LocalPrefillRequest(req), "whole on the decode pool": {Model: "m", Tokens: long, Role: kv.RoleDecode}} {
			if _, err := r.Route(ctx, whole); !errors.Is(err, kv.ErrNoWorkers) || !errors.Is(err, ErrDecodeOnly) {
				t.Errorf("%s: %s: %v, want ErrNoWorkers/ErrDecodeOnly", tc.name, name, err)
			}
		}
		d, err := r.Route(ctx, DecodeLegRequest(req))
		if err != nil {
			t.Fatalf("%s: decode leg: %v", tc.name, err)
		}
		d.Done()
	}

	// A mixed decode pool: whole requests go to the capable worker 4 only.
	r, ix := pd(Config{}, true)
	ix.store(key(3), kv.TierDevice, seq)
	for range 4 {
		d, err := r.Route(ctx, LocalPrefillRequest(req))
		if err != nil {
			t.Fatal(err)
		}
		if d.Worker != key(4) {
			t.Fatalf("mixed pool: local prefill on %v, want %v", d.Worker, key(4))
		}
		if d.Hint == nil {
			t.Errorf("mixed pool: no hint from the decode-only worker holding the prompt")
		}
		d.Done()
	}
	ix.store(key(4), kv.TierDevice, seq)
	if got, err := r.PlanDisagg(ctx, req, DisaggConfig{}); err != nil || got.Path != PathLocalPrefill {
		t.Errorf("mixed pool, worker 4 holds the prompt: %+v %v, want local prefill", got, err)
	}
}
