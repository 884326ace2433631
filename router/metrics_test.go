package router

import (
	"context"
	"errors"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	ix := newFakeIndex()
	r := newRouter(t, Config{Matcher: ix, Registerer: reg, MaxPrefillTokens: 1}, 1)
	// A second router on the same registry shares the collectors.
	r2 := newRouter(t, Config{Matcher: ix, Registerer: reg}, 1)
	p := prompt(1, 64)
	ix.store(key(1), 0, seqOf(p)[:2])
	route(t, r, p)
	if _, err := r.Route(context.Background(), Request{Model: "m", Tokens: p}); !errors.Is(err, kv.ErrAllBusy) {
		t.Fatal(err)
	}
	route(t, r2, p)

	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		got[f.GetName()] = f
	}
	counter := func(name string) float64 {
		f := got[name]
		if f == nil {
			t.Fatalf("metric %s missing", name)
		}
		return f.GetMetric()[0].GetCounter().GetValue()
	}
	byPath := map[string]float64{}
	for _, m := range got["kvmesh_router_decisions_total"].GetMetric() {
		l := map[string]string{}
		for _, lp := range m.GetLabel() {
			l[lp.GetName()] = lp.GetValue()
		}
		if l["mode"] != "kv" {
			t.Errorf("decision series of mode %q", l["mode"])
		}
		byPath[l["path"]] = m.GetCounter().GetValue()
	}
	want := map[string]float64{"aggregated": 2, "local_prefill": 0, "disagg_prefill": 0, "disagg_decode": 0}
	if len(byPath) != len(want) {
		t.Errorf("decisions by path %v, want %v", byPath, want)
	}
	for p, v := range want {
		if byPath[p] != v {
			t.Errorf("decisions by path %v, want %v", byPath, want)
		}
	}
	if v := counter("kvmesh_router_busy_rejections_total"); v != 1 {
		t.Errorf("busy %v", v)
	}
	if v := counter("kvmesh_router_isl_tokens_total"); v != 128 {
		t.Errorf("isl %v", v)
	}
	if v := counter("kvmesh_router_predicted_cached_tokens_total"); v != 64 {
		t.Errorf("cached %v", v)
	}
	stages := map[string]uint64{}
	for _, m := range got["kvmesh_router_overhead_seconds"].GetMetric() {
		stages[m.GetLabel()[0].GetValue()] = m.GetHistogram().GetSampleCount()
	}
	for _, s := range []string{"hash", "match", "score", "total"} {
		if stages[s] != 2 {
			t.Errorf("stage %s observed %d times", s, stages[s])
		}
	}
}

// Each request form the fleet routes has its own decision path.
func TestDecisionPath(t *testing.T) {
	base := Request{Model: "m"}
	for _, c := range []struct {
		req  Request
		want string
	}{
		{base, "aggregated"},
		{Request{Model: "m", Role: kv.RoleAggregated}, "aggregated"},
		{LocalPrefillRequest(base), "local_prefill"},
		{PrefillLegRequest(base), "disagg_prefill"},
		{DecodeLegRequest(base), "disagg_decode"},
	} {
		if got := pathOf(&c.req).String(); got != c.want {
			t.Errorf("%+v: path %s, want %s", c.req, got, c.want)
		}
	}
}
