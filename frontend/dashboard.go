package frontend

import (
	"encoding/json"
	"math"
	"net/http"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvmesh/kvmesh/web"
)

// FleetStatusSource is what the dashboard reads from a backend that knows
// its workers (fleet.Cluster): a JSON-encodable status, shown as is; with
// addresses false it leaves out where workers listen (for a reader
// without an API key, as --open-metrics allows).
type FleetStatusSource interface {
	FleetStatus(addresses bool) any
}

// routeDashboard serves the live dashboard at /dashboard/ and its data at
// /dashboard/api/snapshot.
func (s *Server) routeDashboard(mux *http.ServeMux) {
	mux.Handle("GET /dashboard", http.RedirectHandler("/dashboard/", http.StatusMovedPermanently))
	mux.HandleFunc("GET /dashboard/api/snapshot", s.handleSnapshot)
	mux.Handle("GET /dashboard/", http.StripPrefix("/dashboard", web.Dashboard()))
	mux.HandleFunc("GET /debug/kv-index", s.handleIndexView)
}

// IndexViewSource is a backend whose router keeps a KV index
// (fleet.Cluster): IndexView is every worker key's holdings as the router
// believes them, JSON-encodable, served at /debug/kv-index so they can be
// compared with the workers' own inventories.
type IndexViewSource interface {
	IndexView() any
}

// handleIndexView serves the router's index view; it needs an admin key
// (authorizeAdmin): block hashes are a function of prompts, so a tenant
// could test whether another sent a prompt it guesses.
func (s *Server) handleIndexView(w http.ResponseWriter, r *http.Request) {
	src, ok := s.backend.(IndexViewSource)
	if !ok {
		writeError(w, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Message: "this backend keeps no KV index"})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(src.IndexView())
}

// snapshot is one poll of the dashboard: the fleet's status and every
// kvmesh_* series of /metrics, counters and histograms cumulative (the page
// takes differences between polls).
type snapshot struct {
	TimeUnixMS int64                     `json:"time_unix_ms"`
	Fleet      any                       `json:"fleet"`
	Metrics    map[string][]metricSample `json:"metrics"`
}

type metricSample struct {
	Labels  map[string]string `json:"labels,omitempty"`
	Value   *float64          `json:"value,omitempty"`
	Count   *uint64           `json:"count,omitempty"`
	Sum     *float64          `json:"sum,omitempty"`
	Buckets [][2]float64      `json:"buckets,omitempty"` // [upper bound, cumulative count]; +Inf as 1e308
}

func (s *Server) handleSnapshot(w http.ResponseWriter, r *http.Request) {
	snap := snapshot{TimeUnixMS: time.Now().UnixMilli(), Metrics: map[string][]metricSample{}}
	if src, ok := s.backend.(FleetStatusSource); ok {
		snap.Fleet = src.FleetStatus(s.hasAPIKey(r))
	}
	if s.gatherer != nil {
		mfs, err := s.gatherer.Gather()
		if err != nil && len(mfs) == 0 {
			writeError(w, &apiError{Status: http.StatusInternalServerError, Type: "server_error", Message: "gathering metrics: " + err.Error()})
			return
		}
		for _, mf := range mfs {
			if strings.HasPrefix(mf.GetName(), "kvmesh_") {
				snap.Metrics[mf.GetName()] = samples(mf)
			}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(snap)
}

func samples(mf *dto.MetricFamily) []metricSample {
	out := make([]metricSample, 0, len(mf.GetMetric()))
	for _, m := range mf.GetMetric() {
		var ms metricSample
		if len(m.GetLabel()) > 0 {
			ms.Labels = make(map[string]string, len(m.GetLabel()))
			for _, l := range m.GetLabel() {
				ms.Labels[l.GetName()] = l.GetValue()
			}
		}
		switch {
		case m.Counter != nil:
			ms.Value = finite(m.GetCounter().GetValue())
		case m.Gauge != nil:
			ms.Value = finite(m.GetGauge().GetValue())
		case m.Histogram != nil:
			h := m.GetHistogram()
			c := h.GetSampleCount()
			ms.Count, ms.Sum = &c, finite(h.GetSampleSum())
			for _, b := range h.GetBucket() {
				ms.Buckets = append(ms.Buckets, [2]float64{math.Min(b.GetUpperBound(), math.MaxFloat64), float64(b.GetCumulativeCount())})
			}
			ms.Buckets = append(ms.Buckets, [2]float64{math.MaxFloat64, float64(c)})
		default:
			continue
		}
		out = append(out, ms)
	}
	return out
}

// finite keeps NaN and ±Inf, which JSON cannot carry, out of the snapshot.
func finite(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		v = 0
	}
	return &v
}
