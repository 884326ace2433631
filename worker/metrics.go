package worker

import (
	"fmt"
	"maps"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/hints"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
)

// Request results, the label of kvmesh_worker_requests_total.
const (
	resultFinished    = "finished"    // the engine ended it (stop or length)
	resultError       = "error"       // the engine failed it
	resultRejected    = "rejected"    // invalid request
	resultUnavailable = "unavailable" // the worker is shutting down, or its engine stalled or is unhealthy
	resultCanceled    = "canceled"    // the caller left
	resultAborted     = "aborted"     // the engine closed the stream without a finish
)

// metrics are one worker's Prometheus series, labelled with its model and
// instance so several workers (kvmesh serve) can share a registry.
type metrics struct {
	requests *prometheus.CounterVec
	inflight prometheus.Gauge
	prompt   prometheus.Counter
	cached   prometheus.Counter
	byTier   *prometheus.CounterVec
	output   prometheus.Counter
	stalls   prometheus.Counter
	// engineDowns counts an engine's transitions to unhealthy (engine.Health).
	engineDowns prometheus.Counter
	healthy     prometheus.Gauge
	// hintOutcomes settles every hinted request (hint.go's tickets).
	hintOutcomes *prometheus.CounterVec
	all          []prometheus.Collector
}

func newMetrics(w *Worker) *metrics {
	cl := prometheus.Labels{"model": w.cfg.Model, "instance": natsbus.InstanceToken(w.cfg.InstanceID)}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: cl})
	}
	counterFunc := func(name, help string, f func() float64) prometheus.CounterFunc {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: cl}, f)
	}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_worker_requests_total",
			Help:        "Generate requests by result: finished, error, rejected, unavailable, canceled or aborted.",
			ConstLabels: cl}, []string{"result"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvmesh_worker_inflight_requests",
			Help: "Generate streams being served.", ConstLabels: cl}),
		prompt: counter("kvmesh_worker_prompt_tokens_total", "Prompt tokens of finished requests."),
		cached: counter("kvmesh_worker_cached_prompt_tokens_total", "Prompt tokens served from the prefix cache; divided by kvmesh_worker_prompt_tokens_total it is the KV hit rate."),
		byTier: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_worker_cached_prompt_tokens_by_tier_total",
			Help:        "Cached prompt tokens by where they were found: device, a KV block manager's host, disk or object tier, or peer (fetched from another worker: a KV hint's prefix, a decode leg's handoff).",
			ConstLabels: cl}, []string{"tier"}),
		output:      counter("kvmesh_worker_output_tokens_total", "Tokens streamed to callers."),
		stalls:      counter("kvmesh_worker_engine_stalls_total", "Times the watchdog found the engine stalled (streams in flight, no output for the stall timeout)."),
		engineDowns: counter("kvmesh_worker_engine_unhealthy_total", "Times the engine's health check started failing (a real engine's /health); the worker leaves discovery until it passes again."),
		hintOutcomes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_worker_kv_hint_outcomes_total",
			Help:        "Hinted requests by how their KV hint ended: delivered, dropped or failed, and why; each hinted request counts once.",
			ConstLabels: cl}, []string{"outcome", "reason"}),
		healthy: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvmesh_worker_healthy",
			Help: "1 while the worker serves; 0 once its engine stalled and it left service, or while its engine fails its health check.", ConstLabels: cl}),
	}
	m.healthy.Set(1)
	for _, l := range hintOutcomeLabels {
		m.hintOutcomes.WithLabelValues(l[0], l[1])
	}
	for _, r := range []string{resultFinished, resultError, resultRejected, resultUnavailable, resultCanceled, resultAborted} {
		m.requests.WithLabelValues(r) // every series exists from the start
	}
	pub := func(i int) func() float64 {
		return func() float64 {
			b, e, f := w.pub.Counts()
			return float64([3]int64{b, e, f}[i])
		}
	}
	for _, t := range []string{"device", "host", "disk"} {
		m.byTier.WithLabelValues(t)
	}
	m.all = []prometheus.Collector{m.requests, m.inflight, m.prompt, m.cached, m.byTier, m.output, m.stalls, m.engineDowns, m.healthy, m.hintOutcomes,
		counterFunc("kvmesh_worker_kv_hints_total", "Requests that carried a KV hint.", func() float64 { return float64(w.hints.Load()) }),
		counterFunc("kvmesh_worker_unauthenticated_total", "Worker API calls refused for want of the fleet token.", func() float64 { return float64(w.unauthenticated.Load()) }),
		counterFunc("kvmesh_worker_tls_handshake_failures_total", "Worker API connections refused because the caller failed the TLS handshake (no client certificate, one of another CA, plaintext).", func() float64 { return float64(w.tlsRefused.Load()) }),
		counterFunc("kvmesh_worker_kv_transfer_params_total", "Requests that carried KV transfer parameters (disaggregated serving).", func() float64 { return float64(w.transferParams.Load()) }),
		counterFunc("kvmesh_worker_decode_hints_dropped_total", "KV hints dropped because the request was a decode handoff (a hint is applied on the prefill leg only).", func() float64 { return float64(w.decodeHints.Load()) }),
		counterFunc("kvmesh_worker_foreign_transfer_params_dropped_total", "KV transfer parameters dropped because they arrived on a leg other than a decode leg.", func() float64 { return float64(w.foreignParams.Load()) }),
		counterFunc("kvmesh_worker_event_batches_published_total", "KV event batches published on NATS (serve's own workers: handed to its feed in process).", pub(0)),
		counterFunc("kvmesh_worker_events_published_total", "KV events published on NATS (serve's own workers: handed to its feed in process).", pub(1)),
		counterFunc("kvmesh_worker_event_publish_failures_total", "KV event batches that could not be published (routers repair the gap).", pub(2)),
	}
	m.all = append(m.all, hintParseMetrics(cl, w.hintParser)...)
	if hs, ok := w.eng.(engine.Handoffs); ok {
		m.all = append(m.all, handoffMetrics(cl, hs)...)
	}
	return m
}

// hintParseMetrics export what the worker's hint parser dropped or
// converted in the legacy kv_hint envelopes it was sent.
func hintParseMetrics(cl prometheus.Labels, p *hints.Parser) []prometheus.Collector {
	labelled := func(name, help, label, value string, f func(hints.Counters) uint64) prometheus.Collector {
		l := prometheus.Labels{label: value}
		maps.Copy(l, cl)
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: l},
			func() float64 { return float64(f(p.Counters())) })
	}
	const (
		dropped     = "kvmesh_worker_kv_hint_envelopes_dropped_total"
		droppedHelp = "KV hint envelopes dropped before the engine saw them, by reason: ignored_version (an unknown protocol_version) or malformed."
		actions     = "kvmesh_worker_kv_hint_actions_total"
		actionsHelp = "KV hint actions the worker did not take as sent, by outcome: skipped (an unsupported action_version) or legacy_converted (kv.source_locations read as kv.fetch)."
	)
	return []prometheus.Collector{
		labelled(dropped, droppedHelp, "reason", "ignored_version", func(c hints.Counters) uint64 { return c.IgnoredVersion }),
		labelled(dropped, droppedHelp, "reason", "malformed", func(c hints.Counters) uint64 { return c.Malformed }),
		labelled(actions, actionsHelp, "outcome", "skipped", func(c hints.Counters) uint64 { return c.SkippedActions }),
		labelled(actions, actionsHelp, "outcome", "legacy_converted", func(c hints.Counters) uint64 { return c.LegacyConverted }),
	}
}

// register adds every series to reg; on failure none stays registered.
func (m *metrics) register(reg prometheus.Registerer) error {
	for i, c := range m.all {
		if err := reg.Register(c); err != nil {
			for _, done := range m.all[:i] {
				reg.Unregister(done)
			}
			return fmt.Errorf("worker metrics: %w", err)
		}
	}
	return nil
}

func (m *metrics) unregister(reg prometheus.Registerer) {
	for _, c := range m.all {
		reg.Unregister(c)
	}
}

// addTiers splits a finished request's cached tokens by tier.
func (m *metrics) addTiers(u *engine.Usage) {
	c := u.ByTier()
	m.byTier.WithLabelValues("device").Add(float64(c[kv.TierDevice]))
	m.byTier.WithLabelValues("host").Add(float64(c[kv.TierHost]))
	m.byTier.WithLabelValues("disk").Add(float64(c[kv.TierDisk]))
	// Only workers with an object tier, or fetching from peers, grow
	// those series.
	if n := c[kv.TierExternal]; n > 0 {
		m.byTier.WithLabelValues("object").Add(float64(n))
	}
	if n := c[kv.PeerCached]; n > 0 {
		m.byTier.WithLabelValues("peer").Add(float64(n))
	}
}
