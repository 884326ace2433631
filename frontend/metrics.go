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
