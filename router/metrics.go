package router

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/kv"
)

type metrics struct {
	hash, match, score, total prometheus.Observer
	decisions                 [numDecisionPaths]prometheus.Counter // this router's mode, by path
	busy                      prometheus.Counter
	expired                   prometheus.Counter
	hints                     prometheus.Counter
	islTokens, cachedTokens   prometheus.Counter
	prefixTokens              *prometheus.CounterVec // by model and kind (reachable, routed)
}

// newMetrics builds the router's metrics and registers them on reg (if not
// nil). Collectors already registered by another router on the same
// registry are shared.
func newMetrics(reg prometheus.Registerer, mode Mode) (*metrics, error) {
	overhead := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kvmesh_router_overhead_seconds",
		Help:    "Time spent per routing decision, by stage (hash, match, score, total).",
		Buckets: prometheus.ExponentialBuckets(1e-6, 2, 18), // 1 µs … 131 ms
	}, []string{"stage"})
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_router_decisions_total",
		Help: "Routing decisions made, by router mode and path: aggregated, local_prefill (a decode worker prefilling itself), disagg_prefill, disagg_decode."},
		[]string{"mode", "path"})
	busy := counter("kvmesh_router_busy_rejections_total", "Requests rejected because every worker was busy.")
	expired := counter("kvmesh_router_expired_requests_total", "Active requests freed by the stale-request sweep (a Done never came).")
	hints := counter("kvmesh_router_hints_planned_total", "Decisions that carry a KV hint plan.")
	isl := counter("kvmesh_router_isl_tokens_total", "Prompt tokens routed.")
	cached := counter("kvmesh_router_predicted_cached_tokens_total", "Prompt tokens the router predicted cached on the chosen worker; divided by kvmesh_router_isl_tokens_total it is the predicted KV hit rate.")
	prefix := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_router_prefix_tokens_total",
		Help: "Routing regret, in prompt tokens: kind=reachable is the longest prefix any eligible worker held, kind=routed what the chosen worker held (any tier, per decision)."},
		[]string{"model", "kind"})

	if reg != nil {
		var err error
		overhead = register(reg, overhead, &err)
		decisions = register(reg, decisions, &err)
		busy = register(reg, busy, &err)
		expired = register(reg, expired, &err)
		hints = register(reg, hints, &err)
		isl = register(reg, isl, &err)
		cached = register(reg, cached, &err)
		prefix = register(reg, prefix, &err)
		if err != nil {
			return nil, fmt.Errorf("router: registering metrics: %w", err)
		}
	}
	m := &metrics{
		hash:         overhead.WithLabelValues("hash"),
		match:        overhead.WithLabelValues("match"),
		score:        overhead.WithLabelValues("score"),
		total:        overhead.WithLabelValues("total"),
		busy:         busy,
		expired:      expired,
		hints:        hints,
		islTokens:    isl,
		cachedTokens: cached,
		prefixTokens: prefix,
	}
	for p := range m.decisions {
		// Every path of this mode exists from the start, at zero.
		m.decisions[p] = decisions.WithLabelValues(string(mode), decisionPath(p).String())
	}
	return m, nil
}

// decisionPath is what a decision served: the path label of
// kvmesh_router_decisions_total. A disaggregated request makes two
// decisions (its prefill and decode legs); the fleet counts requests by
// path in kvmesh_fleet_requests_by_path_total.
type decisionPath uint8

const (
	decisionAggregated decisionPath = iota
	decisionLocalPrefill
	decisionDisaggPrefill
	decisionDisaggDecode
	numDecisionPaths
)

func (p decisionPath) String() string {
	return [...]string{"aggregated", "local_prefill", "disagg_prefill", "disagg_decode"}[p]
}

// pathOf classifies a request by the pool it is routed over and how
// (PrefillLegRequest, DecodeLegRequest, LocalPrefillRequest).
func pathOf(req *Request) decisionPath {
	switch req.Role {
	case kv.RolePrefill:
		return decisionDisaggPrefill
	case kv.RoleDecode:
		if req.NoOverlapCredit {
			return decisionDisaggDecode
		}
		return decisionLocalPrefill
	}
	return decisionAggregated
}

func register[C prometheus.Collector](reg prometheus.Registerer, c C, errp *error) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		if *errp == nil {
			*errp = err
		}
	}
	return c
}

func (m *metrics) observe(d *Decision, model string, path decisionPath) {
	m.hash.Observe(d.Timing.Hash.Seconds())
	m.match.Observe(d.Timing.Match.Seconds())
	m.score.Observe(d.Timing.Score.Seconds())
	m.total.Observe(d.Timing.Total.Seconds())
	m.decisions[path].Inc()
	m.islTokens.Add(float64(d.ISL))
	m.cachedTokens.Add(float64(d.CachedTokens))
	m.prefixTokens.WithLabelValues(model, "reachable").Add(float64(d.ReachableTokens))
	m.prefixTokens.WithLabelValues(model, "routed").Add(float64(d.RoutedTokens))
	if d.Hint != nil {
		m.hints.Inc()
	}
}
