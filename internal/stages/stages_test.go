package stages

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func scrapeReg(t *testing.T, reg *prometheus.Registry) Snapshot {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	s, err := Scrape(context.Background(), srv.Client(), srv.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestClockObservesEachStageOnce(t *testing.T) {
	reg := prometheus.NewRegistry()
	r, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	// A second registration (a worker beside the frontend) shares the family.
	r2, err := New(reg)
	if err != nil {
		t.Fatalf("second registration: %v", err)
	}
	c := r.StartAt(time.Now().Add(-3 * time.Millisecond))
	ctx := With(context.Background(), c)
	if From(ctx) != c {
		t.Fatal("the context does not carry the clock")
	}
	if d := From(ctx).Mark(ReadBody); d < 3*time.Millisecond {
		t.Fatalf("read_body took %v, want ≥ 3ms since the start", d)
	}
	c.Mark(ReadBody) // a second mark of a stage only moves the clock
	c.last = c.last.Add(-2 * time.Millisecond)
	c.MarkSplit(Hash, time.Millisecond, Route)
	r2.Start().Mark(WorkerAdmit)

	s := scrapeReg(t, reg)
	want := map[string]uint64{"read_body": 1, "hash": 1, "route": 1, "worker_admit": 1, "parse": 0}
	for stage, n := range want {
		if got := s[stage].Total(); got != n {
			t.Errorf("%s observed %d times, want %d", stage, got, n)
		}
	}
	// hash got the callee's 1ms, route the rest (≥ 1ms).
	if q := s["hash"].Quantile(0.5); q < 0.00075 || q > 0.00125 {
		t.Errorf("hash p50 %v s, want about 1ms", q)
	}
	if q := s["route"].Quantile(0.5); q < 0.00075 {
		t.Errorf("route p50 %v s, want ≥ about 1ms", q)
	}
}

func TestNilClockAndRecorderDoNothing(t *testing.T) {
	var r *Recorder
	c := r.Start()
	if c != nil {
		t.Fatal("a nil recorder started a clock")
	}
	c.Mark(Parse)
	c.MarkSplit(Hash, time.Millisecond, Route)
	if From(With(context.Background(), c)) != nil {
		t.Fatal("a nil clock was put in the context")
	}
}

func TestQuantileAndSince(t *testing.T) {
	before := Snapshot{"x": {Upper: []float64{1, 2, 4, math.Inf(1)}, Count: []uint64{10, 10, 10, 10}}}
	after := Snapshot{"x": {Upper: []float64{1, 2, 4, math.Inf(1)}, Count: []uint64{10, 20, 30, 31}},
		"y": {Upper: []float64{1, math.Inf(1)}, Count: []uint64{2, 2}}}
	d := after.Since(before)
	if n := d["x"].Total(); n != 21 {
		t.Fatalf("x: %d observations since, want 21", n)
	}
	if n := d["y"].Total(); n != 2 {
		t.Fatalf("y (new): %d observations, want 2", n)
	}
	// 21 in (1,2]:10, (2,4]:10, +Inf:1. The median (rank 10.5) is just
	// past the first bucket: 2 + 2·0.5/10.
	if q := d["x"].Quantile(0.5); math.Abs(q-2.1) > 1e-9 {
		t.Errorf("p50 %v, want 2.1", q)
	}
	if q := d["x"].Quantile(0.99); q != 4 {
		t.Errorf("p99 in the +Inf bucket: %v, want the last finite bound 4", q)
	}
	if q := (Hist{}).Quantile(0.5); !math.IsNaN(q) {
		t.Errorf("empty: %v, want NaN", q)
	}
}

func TestScrapeWithoutFamilyAndRefused(t *testing.T) {
	if s := scrapeReg(t, prometheus.NewRegistry()); len(s) != 0 {
		t.Fatalf("a registry without the family gave %v", s)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer k" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		w.Write([]byte("# TYPE kvmesh_request_stage_seconds histogram\nkvmesh_request_stage_seconds_bucket{stage=\"parse\",le=\"0.001\"} 3\nkvmesh_request_stage_seconds_bucket{stage=\"parse\",le=\"+Inf\"} 4\nkvmesh_request_stage_seconds_sum{stage=\"parse\"} 0.01\nkvmesh_request_stage_seconds_count{stage=\"parse\"} 4\n"))
	}))
	defer srv.Close()
	if _, err := Scrape(context.Background(), srv.Client(), srv.URL, ""); err == nil {
		t.Fatal("a 401 scraped without error")
	}
	s, err := Scrape(context.Background(), srv.Client(), srv.URL, "k")
	if err != nil {
		t.Fatal(err)
	}
	if n := s["parse"].Total(); n != 4 {
		t.Fatalf("parse: %d, want 4", n)
	}
}

func TestStageNames(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range All() {
		if n := s.String(); n == "" || n == "unknown" || seen[n] {
			t.Fatalf("stage %d named %q", s, n)
		}
		seen[s.String()] = true
	}
	if numStages > 32 {
		t.Fatal("Clock.done holds 32 stages")
	}
}
