package router

import (
	"context"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

func TestPreferAggregated(t *testing.T) {
	ctx := context.Background()
	r := pdRouter(t, newFakeIndex(), Config{}) // prefill 1, 2; decode 3, 4
	if r.PreferAggregated("m") {
		t.Fatal("no aggregated pool, yet preferred")
	}
	if err := r.AddWorker(roleInfo(5, kv.RoleAggregated)); err != nil {
		t.Fatal(err)
	}
	if !r.PreferAggregated("m") {
		t.Fatal("idle pools: aggregated not preferred")
	}
	// One request on the aggregated worker (1 each) against none on the
	// decode workers: decode is less loaded.
	a, err := r.Route(ctx, Request{Model: "m", Tokens: prompt(1, 4*testBS)})
	if err != nil || a.Worker != key(5) {
		t.Fatalf("%+v %v", a, err)
	}
	if r.PreferAggregated("m") {
		t.Fatal("busier aggregated pool preferred")
	}
	// Two decode legs (one per decode worker): 1 each on both pools.
	for i := range 2 {
		d, err := r.Route(ctx, DecodeLegRequest(Request{Model: "m", Tokens: prompt(10+i, 4*testBS)}))
		if err != nil {
			t.Fatal(err)
		}
		defer d.Done()
	}
	if !r.PreferAggregated("m") {
		t.Fatal("equal load: aggregated not preferred")
	}
	a.Done()
	if r.PreferAggregated("other") {
		t.Fatal("unknown model preferred")
	}
}
