package router

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/kv"
)

// regretFleet is three workers over one prompt of 100 tokens (6 full
// blocks of 16): worker 1 holds 4 blocks on device, worker 2 holds 2 on
// host only, worker 3 none.
func regretFleet(t *testing.T, mode Mode, reg prometheus.Registerer) (*Router, []kv.Token) {
	t.Helper()
	ix := newFakeIndex()
	r := newRouter(t, Config{Mode: mode, Matcher: ix, Registerer: reg}, 1, 2, 3)
	p := prompt(7, 100)
	seq := seqOf(p)
	ix.store(key(1), kv.TierDevice, seq[:4])
	ix.store(key(2), kv.TierHost, seq[:2])
	return r, p
}

// Round-robin visits every worker: each decision could have reached
// worker 1's 64 tokens and got what the chosen one holds, on any tier,
// while the mode still credits nothing.
func TestRegretRoundRobin(t *testing.T) {
	reg := prometheus.NewRegistry()
	r, p := regretFleet(t, ModeRoundRobin, reg)
	wantRouted := map[uint64]int{1: 64, 2: 32, 3: 0}
	for range 3 {
		d := route(t, r, p)
		if d.ReachableTokens != 64 || d.RoutedTokens != wantRouted[d.Worker.Instance] {
			t.Errorf("worker %d: reachable %d routed %d, want 64 and %d", d.Worker.Instance, d.ReachableTokens, d.RoutedTokens, wantRouted[d.Worker.Instance])
		}
		if d.CachedTokens != 0 || d.PrefillTokens != 100 {
			t.Errorf("round-robin credited %d cached tokens, booked %d prefill", d.CachedTokens, d.PrefillTokens)
		}
	}
	want := map[string]float64{"reachable": 3 * 64, "routed": 64 + 32}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "kvmesh_router_prefix_tokens_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["model"] != "m" {
				t.Errorf("series of model %q", l["model"])
			}
			got[l["kind"]] = m.GetCounter().GetValue()
		}
	}
	if len(got) != 2 || got["reachable"] != want["reachable"] || got["routed"] != want["routed"] {
		t.Errorf("kvmesh_router_prefix_tokens_total %v, want %v", got, want)
	}
}

// Only eligible workers count: with worker 1 excluded the best reachable
// is worker 2's host copy, which kv routing takes.
func TestRegretEligibleOnly(t *testing.T) {
	r, p := regretFleet(t, ModeKV, nil)
	d, err := r.Route(context.Background(), Request{Model: "m", Tokens: p, Exclude: []kv.WorkerKey{key(1)}})
	if err != nil {
		t.Fatal(err)
	}
	if d.Worker != key(2) || d.ReachableTokens != 32 || d.RoutedTokens != 32 || d.CachedTokens != 32 {
		t.Errorf("chose %v reachable %d routed %d cached %d, want worker 2 and 32 tokens each", d.Worker, d.ReachableTokens, d.RoutedTokens, d.CachedTokens)
	}
}
