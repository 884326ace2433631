package worker

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/hints"
	"github.com/kvmesh/kvmesh/kv"
)

// The seeds' rule for disaggregated serving (research kvcr_hints.md §4.2),
// enforced where a request enters the worker, before it is lowered to the
// engine's request shape:
//
//   - a KV hint is applied once, on the stage that computes the prompt: a
//     decode leg, or any request whose connector parameters make it a
//     decode handoff (vLLM's do_remote_prefill), never applies one;
//   - connector parameters travel only on a decode leg, where they are the
//     prefill's answer, installed whole (replacing, never merging) with any
//     kv_hint/router_hint removed, copy-on-write: the bytes are passed on
//     untouched unless something had to be removed;
//   - connector parameters on any other leg came from outside kvmesh and
//     are dropped.

// legAdmission is what admitLeg decided for one request.
type legAdmission struct {
	leg         kv.Leg
	params      []byte // what the engine gets
	dropHint    bool   // the request may not apply a hint
	paramsDrop  bool   // parameters arrived on a leg that takes none
	paramsStrip bool   // hint keys were removed from the parameters
}

// admitLeg applies the rule to req; an error is the request's fault
// (InvalidArgument).
func admitLeg(req *api.GenerateRequest) (legAdmission, error) {
	leg, err := api.LegFromProto(req.Leg)
	if err != nil {
		return legAdmission{}, err
	}
	a := legAdmission{leg: leg}
	raw := req.KvTransferParams
	if leg != kv.LegDecode {
		if len(raw) > 0 {
			a.paramsDrop = true
			// vLLM's mark of a request that consumes a prefill's KV.
			var m map[string]any
			if json.Unmarshal(raw, &m) == nil && m["do_remote_prefill"] == true {
				a.dropHint = true
			}
		}
		return a, nil
	}
	a.dropHint = true
	if len(raw) == 0 {
		return a, fmt.Errorf("decode leg without kv_transfer_params")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber() // u64 hashes stay exact if re-encoded
	var m map[string]any
	if err := dec.Decode(&m); err != nil || m == nil {
		return a, fmt.Errorf("decode leg: kv_transfer_params must be a JSON object")
	}
	_, h1 := m[hints.KeyKVHint]
	_, h2 := m[hints.KeyRouterHint]
	if !h1 && !h2 {
		a.params = raw
		return a, nil
	}
	// m is this request's own decoding: strip in place.
	delete(m, hints.KeyKVHint)
	delete(m, hints.KeyRouterHint)
	b, err := json.Marshal(m)
	if err != nil {
		return a, fmt.Errorf("decode leg: kv_transfer_params: %v", err)
	}
	a.params, a.paramsStrip = b, true
	return a, nil
}

// paramsDigest names connector parameters in logs (a short sha256).
func paramsDigest(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:8])
}

// handoffMetrics are the disaggregation series of an engine that counts
// its legs: handoff bytes and time, pull failures and recomputes (decode
// side), pinned prefill blocks (prefill side).
func handoffMetrics(cl prometheus.Labels, e engine.Handoffs) []prometheus.Collector {
	f := func(name, help string, v func(engine.HandoffStats) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: cl},
			func() float64 { return v(e.HandoffStats()) })
	}
	g := func(name, help string, v func(engine.HandoffStats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: cl},
			func() float64 { return v(e.HandoffStats()) })
	}
	by := func(how string, v func(engine.HandoffStats) uint64) prometheus.Collector {
		l := prometheus.Labels{"by": how}
		for k, v := range cl {
			l[k] = v
		}
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvmesh_disagg_handoffs_released_total",
			Help:        "Pinned handoffs released before their expiry, by the decode side's release message (by=release) or by a peer's read of their last block (by=read).",
			ConstLabels: l}, func() float64 { return float64(v(e.HandoffStats())) })
	}
	return []prometheus.Collector{
		by("release", func(s engine.HandoffStats) uint64 { return s.Released }),
		by("read", func(s engine.HandoffStats) uint64 { return s.Read }),
		f("kvmesh_disagg_release_failures_total", "Release messages a decode leg could not deliver (the prefill side's handoff TTL frees those pins).", func(s engine.HandoffStats) float64 { return float64(s.ReleaseErrors) }),
		f("kvmesh_disagg_prefill_handoffs_total", "Prefill legs answered with connector parameters.", func(s engine.HandoffStats) float64 { return float64(s.Prefills) }),
		g("kvmesh_disagg_pinned_blocks", "Prefill blocks pinned until a decode worker reads them or the handoff expires.", func(s engine.HandoffStats) float64 { return float64(s.PinnedBlocks) }),
		f("kvmesh_disagg_handoffs_expired_total", "Pinned handoffs released at their expiry, unread.", func(s engine.HandoffStats) float64 { return float64(s.Expired) }),
		f("kvmesh_disagg_decode_legs_total", "Decode legs served.", func(s engine.HandoffStats) float64 { return float64(s.Decodes) }),
		f("kvmesh_disagg_handoff_bytes_total", "KV bytes pulled from prefill workers by decode legs.", func(s engine.HandoffStats) float64 { return float64(s.PullBytes) }),
		f("kvmesh_disagg_handoff_seconds_total", "Time decode legs spent pulling KV from prefill workers.", func(s engine.HandoffStats) float64 { return float64(s.PullNanos) / 1e9 }),
		f("kvmesh_disagg_handoff_blocks_total", "KV blocks pulled from prefill workers by decode legs.", func(s engine.HandoffStats) float64 { return float64(s.PulledBlks) }),
		f("kvmesh_disagg_pull_failures_total", "Decode-leg pulls that failed (fewer blocks arrived than the handoff named).", func(s engine.HandoffStats) float64 { return float64(s.Failures) }),
		f("kvmesh_disagg_recomputes_total", "Decode legs that recomputed part of the prompt (pull failure, bad or sourceless parameters).", func(s engine.HandoffStats) float64 { return float64(s.Recomputes) }),
	}
}
