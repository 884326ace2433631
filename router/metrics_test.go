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
	if v := counter("kvmesh_router_decisions_total"); v != 2 {
		t.Errorf("decisions %v", v)
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
