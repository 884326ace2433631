package router

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/kvmesh/kvmesh/kv"
)

// Disaggregated prefill/decode policy (research kvbm_disagg.md §3, Dynamo's
// prefill-first flow): a request first gets a prefill leg on the prefill
// pool, KV-routed, then a decode leg on the decode pool by load alone —
// unless conditional disaggregation keeps the prefill on the decode worker.
// Everything here is pure: the caller (fleet, twin) does the legs.

// DisaggPath is the way one request was served.
type DisaggPath string

const (
	PathAggregated   DisaggPath = "aggregated"    // the aggregated pool, one leg
	PathDisagg       DisaggPath = "disagg"        // prefill leg, then decode leg
	PathLocalPrefill DisaggPath = "local_prefill" // decode worker prefills itself
)

// LocalReason says why a request prefilled on its decode worker.
type LocalReason string

const (
	// ReasonISL: the prompt's net new part (prompt − what the decode
	// worker holds) is short both absolutely and relative to the prompt.
	ReasonISL LocalReason = "isl"
	// ReasonPrefillBusy: every prefill worker is over a busy threshold.
	ReasonPrefillBusy LocalReason = "prefill_busy"
)

// DisaggConfig configures conditional disaggregation. The zero value of
// each field picks its default.
type DisaggConfig struct {
	// LocalPrefillTokens: a request prefills locally when its net new
	// prompt is under this many tokens (and under LocalPrefillRatio of the
	// prompt). Default 2048; negative: never for length.
	LocalPrefillTokens int
	// LocalPrefillRatio: the second bound, net new / prompt. Default 0.7;
	// at most 1.
	LocalPrefillRatio float64
	// NoBusyBypass keeps requests on the prefill pool even when every
	// prefill worker is busy (the prefill leg then waits for one).
	NoBusyBypass bool
}

// Defaults of DisaggConfig.
const (
	DefaultLocalPrefillTokens = 2048
	DefaultLocalPrefillRatio  = 0.7
)

// WithDefaults returns c with its zero fields defaulted.
func (c DisaggConfig) WithDefaults() DisaggConfig {
	if c.LocalPrefillTokens == 0 {
		c.LocalPrefillTokens = DefaultLocalPrefillTokens
	}
	if c.LocalPrefillRatio == 0 {
		c.LocalPrefillRatio = DefaultLocalPrefillRatio
	}
	return c
}

// Validate reports a ratio outside (0, 1] (after defaults).
func (c DisaggConfig) Validate() error {
	c = c.WithDefaults()
	if !(c.LocalPrefillRatio > 0 && c.LocalPrefillRatio <= 1) || math.IsNaN(c.LocalPrefillRatio) {
		return fmt.Errorf("%w: local prefill ratio %v must be in (0, 1]", errConfig, c.LocalPrefillRatio)
	}
	return nil
}

// DisaggInput is what conditional disaggregation looks at.
type DisaggInput struct {
	PromptTokens int
	// DecodeCached is the prefix, in tokens, the decode worker the router
	// would pick already holds (Peek on the decode pool).
	DecodeCached int
	// PrefillBusy: the prefill worker the router would pick is over its
	// busy threshold (Peek on the prefill pool answered kv.ErrAllBusy).
	PrefillBusy bool
	// DecodeOnly: no decode worker can prefill alone (WorkerInfo.DecodeOnly),
	// so the request disaggregates whatever its length or the prefill load.
	DecodeOnly bool
}

// DisaggChoice is conditional disaggregation's answer: PathDisagg, or
// PathLocalPrefill with its Reason.
type DisaggChoice struct {
	Path   DisaggPath
	Reason LocalReason // set for PathLocalPrefill only
	NetNew int         // prompt tokens the decode worker would compute
}

// DecideDisagg is conditional disaggregation (Dynamo's IslOrLoad policy):
// prefill locally on the decode worker when the net new prompt is under
// both bounds of cfg, or when the prefill pool is busy; otherwise
// disaggregate. Length is checked first, so a short prompt reports "isl"
// even when the prefill pool is also busy.
func DecideDisagg(cfg DisaggConfig, in DisaggInput) DisaggChoice {
	cfg = cfg.WithDefaults()
	netNew := max(in.PromptTokens-max(in.DecodeCached, 0), 0)
	out := DisaggChoice{Path: PathDisagg, NetNew: netNew}
	if in.DecodeOnly {
		return out
	}
	if cfg.LocalPrefillTokens > 0 && netNew < cfg.LocalPrefillTokens &&
		(in.PromptTokens <= 0 || float64(netNew) < cfg.LocalPrefillRatio*float64(in.PromptTokens)) {
		out.Path, out.Reason = PathLocalPrefill, ReasonISL
		return out
	}
	if in.PrefillBusy && !cfg.NoBusyBypass {
		out.Path, out.Reason = PathLocalPrefill, ReasonPrefillBusy
	}
	return out
}

// PlanDisagg peeks both pools of req.Model (req.Role is ignored) and
// decides with DecideDisagg. It books nothing: the caller then routes the
// legs with PrefillLegRequest/DecodeLegRequest, or the local prefill with
// LocalPrefillRequest. An error means the decode pool cannot serve the
// request (kv.ErrNoWorkers, or *kv.BusyError when all decode workers are
// busy) or the prefill pool has no workers; a busy prefill pool is not an
// error but PrefillBusy.
func (r *Router) PlanDisagg(ctx context.Context, req Request, cfg DisaggConfig) (DisaggChoice, error) {
	dec, err := r.Peek(ctx, LocalPrefillRequest(req))
	decodeOnly := errors.Is(err, ErrDecodeOnly)
	if decodeOnly {
		// Only decode legs fit the pool: it can serve the request
		// disaggregated, never locally.
		dec, err = r.Peek(ctx, DecodeLegRequest(req))
	}
	if err != nil {
		return DisaggChoice{}, err
	}
	if decodeOnly {
		dec.CachedTokens = 0
	}
	busy := false
	if _, err := r.Peek(ctx, PrefillLegRequest(req)); err != nil {
		if !errors.Is(err, kv.ErrAllBusy) {
			return DisaggChoice{}, err
		}
		busy = true
	}
	return DecideDisagg(cfg, DisaggInput{PromptTokens: dec.ISL, DecodeCached: dec.CachedTokens, PrefillBusy: busy, DecodeOnly: decodeOnly}), nil
}
