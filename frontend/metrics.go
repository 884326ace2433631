package frontend

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	requests   *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	ttft       *prometheus.HistogramVec
	itl        *prometheus.HistogramVec
	inflight   prometheus.Gauge
	migrations prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_frontend_requests_total", Help: "HTTP requests by model, endpoint and status code.",
		}, []string{"model", "endpoint", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvmesh_frontend_request_duration_seconds", Help: "Request latency, end to end.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18),
		}, []string{"model", "endpoint"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvmesh_frontend_time_to_first_token_seconds", Help: "Time to first token.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18),
		}, []string{"model"}),
		itl: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvmesh_frontend_inter_token_latency_seconds", Help: "Time between consecutive tokens.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"model"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvmesh_frontend_inflight_requests", Help: "Requests being served.",
		}),
		migrations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_frontend_migrations_total", Help: "Requests moved to another worker after a worker failure.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.duration, m.ttft, m.itl, m.inflight, m.migrations)
	}
	return m
}

// prefixCollector reports every served model's prefix-tokenization cache
// (models come and go with the fleet, so they are read at each scrape).
type prefixCollector struct {
	models                    ModelSource
	hits, misses, reused, off *prometheus.Desc
}

func newPrefixCollector(models ModelSource) *prefixCollector {
	l := []string{"model"}
	return &prefixCollector{models: models,
		hits:   prometheus.NewDesc("kvmesh_frontend_prefix_cache_hits_total", "Chat prompts that reused an earlier prompt's tokens.", l, nil),
		misses: prometheus.NewDesc("kvmesh_frontend_prefix_cache_misses_total", "Chat prompts tokenized whole (no earlier prompt's start found).", l, nil),
		reused: prometheus.NewDesc("kvmesh_frontend_prefix_cache_reused_tokens_total", "Prompt tokens taken from the cache instead of tokenized.", l, nil),
		off:    prometheus.NewDesc("kvmesh_frontend_prefix_cache_off", "1 when a hit failed its check against a whole tokenization and the cache turned itself off.", l, nil),
	}
}

func (c *prefixCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.hits
	ch <- c.misses
	ch <- c.reused
	ch <- c.off
}

func (c *prefixCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.models.Models() {
		if m.prefixCache == nil {
			continue
		}
		st := m.PrefixStats()
		off := 0.0
		if st.Off {
			off = 1
		}
		ch <- prometheus.MustNewConstMetric(c.hits, prometheus.CounterValue, float64(st.Hits), m.Name)
		ch <- prometheus.MustNewConstMetric(c.misses, prometheus.CounterValue, float64(st.Misses), m.Name)
		ch <- prometheus.MustNewConstMetric(c.reused, prometheus.CounterValue, float64(st.Reused), m.Name)
		ch <- prometheus.MustNewConstMetric(c.off, prometheus.GaugeValue, off, m.Name)
	}
}
