package transfer

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric scopes/operations: the fetching side and the serving side. Label
// values are drawn only from these and from Outcome, never from endpoints,
// hashes or request ids, so cardinality stays bounded.
const (
	scopeFetch = "fetch"
	scopeServe = "serve"
)

// Metrics are the transfer package's prometheus series, shaped like KVCR's
// kvcr_duration_seconds{scope,result} and kvcr_transfer_{bytes,blocks}. A nil
// *Metrics records nothing.
type Metrics struct {
	duration *prometheus.HistogramVec
	bytes    *prometheus.CounterVec
	blocks   *prometheus.CounterVec
	inFlight *prometheus.GaugeVec
	refused  *prometheus.CounterVec
}

// Reasons a source refused part or all of a fetch (kvmesh_transfer_refused_total).
const (
	// refusedSaltDomain: a requested block was stored under another salt
	// domain; the served prefix ended before it.
	refusedSaltDomain = "salt_domain"
)

// NewMetrics creates the series and registers them on reg (never on the
// global registry unless the caller passes it).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvmesh_transfer_duration_seconds",
			Help:    "Peer KV transfer duration by scope (fetch: target side, serve: source side) and result.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16), // 100 µs .. ~3.3 s
		}, []string{"scope", "result"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_transfer_bytes_total",
			Help: "Block payload bytes moved by peer KV transfer (fetch: verified and delivered; serve: sent).",
		}, []string{"operation"}),
		blocks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_transfer_blocks_total",
			Help: "Blocks moved by peer KV transfer (fetch: verified and delivered; serve: sent).",
		}, []string{"operation"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvmesh_transfer_in_flight",
			Help: "Peer KV transfers in progress.",
		}, []string{"operation"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_transfer_refused_total",
			Help: "Fetches a source cut short or refused for a trust reason (salt_domain: a block of another tenant's salt).",
		}, []string{"reason"}),
	}
	// Both operations' counters exist from the start, so dashboards and
	// rate() see zeros before the first transfer rather than no series.
	for _, op := range []string{"fetch", "serve"} {
		m.bytes.WithLabelValues(op)
		m.blocks.WithLabelValues(op)
		m.inFlight.WithLabelValues(op)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.duration, m.bytes, m.blocks, m.inFlight, m.refused} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register transfer metrics: %w", err)
			}
		}
	}
	return m, nil
}

func (m *Metrics) refuse(reason string) {
	if m != nil {
		m.refused.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) begin(scope string) {
	if m != nil {
		m.inFlight.WithLabelValues(scope).Inc()
	}
}

func (m *Metrics) end(scope string, o Outcome, d time.Duration, blocks int, bytes int64) {
	if m == nil {
		return
	}
	m.inFlight.WithLabelValues(scope).Dec()
	m.duration.WithLabelValues(scope, o.String()).Observe(d.Seconds())
	if blocks > 0 {
		m.blocks.WithLabelValues(scope).Add(float64(blocks))
		m.bytes.WithLabelValues(scope).Add(float64(bytes))
	}
}
