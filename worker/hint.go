package worker

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/hints"
	"github.com/kvmesh/kvmesh/kv"
)

// Hint outcomes, the outcome label of kvmesh_worker_kv_hint_outcomes_total:
// every hinted request a worker takes ends in exactly one, on every engine,
// so the frontend's planned hints for a worker equal its outcomes plus what
// never reached it (kvmesh_fleet_kv_hints_dropped_total).
const (
	outcomeDelivered = "delivered" // the engine took the hint
	outcomeDropped   = "dropped"   // the worker never handed it to the engine
	outcomeFailed    = "failed"    // handed over, but the fetch or the request failed first
)

// Reasons of the outcomes, the reason label. Delivered: lowered (an engine
// that does not report use accepted the request carrying it) or the
// fetcher's HintFetched, HintPartial, HintUnused. Dropped: HintMalformed,
// HintIgnored, reasonNoSource, reasonDecodeLeg. Failed: HintFallback,
// reasonRequestEnded.
const (
	reasonLowered      = "lowered"
	reasonNoSource     = "no_source"
	reasonDecodeLeg    = "decode_leg"
	reasonRequestEnded = "request_ended"
)

var hintOutcomeLabels = [][2]string{
	{outcomeDelivered, reasonLowered}, {outcomeDelivered, HintFetched}, {outcomeDelivered, HintPartial}, {outcomeDelivered, HintUnused},
	{outcomeDropped, HintMalformed}, {outcomeDropped, HintIgnored}, {outcomeDropped, reasonNoSource}, {outcomeDropped, reasonDecodeLeg},
	{outcomeFailed, HintFallback}, {outcomeFailed, reasonRequestEnded},
}

// admitHint is where a KV hint enters the worker: the typed kv_fetch, or
// else the legacy JSON kv_hint. It returns the hint the engine gets,
// validated (hints.CheckHint: a canonical endpoint, at least one hash, no
// more than the prompt's full blocks), or nil, having settled t as dropped:
// malformed, ignored (an envelope of an unknown protocol_version) or no
// source (an envelope naming none).
func (w *Worker) admitHint(req *api.GenerateRequest, t *hintTicket) *kv.Hint {
	var h *kv.Hint
	if req.KvFetch != nil {
		h = api.HintFromProto(req.KvFetch)
	} else {
		env, err := w.hintParser.Parse(req.KvHint)
		switch {
		case errors.Is(err, hints.ErrIgnored):
			w.hintEnded(t, HintIgnored, HintIgnored, req.RequestId, nil)
			return nil
		case err != nil:
			w.hintEnded(t, HintMalformed, HintMalformed, req.RequestId, err)
			return nil
		}
		var ok bool
		if h, ok = env.Hint(); !ok {
			w.hintEnded(t, reasonNoSource, HintUnused, req.RequestId, nil)
			return nil
		}
	}
	if err := hints.CheckHint(h, kv.NumFullBlocks(len(req.Tokens), w.blockSize)); err != nil {
		w.hintEnded(t, HintMalformed, HintMalformed, req.RequestId, err)
		return nil
	}
	return h
}

// hintEnded settles t as dropped for reason (and counts the Peer's result,
// if any); a malformed hint is logged (once per worker: a misbehaving
// router would send many).
func (w *Worker) hintEnded(t *hintTicket, reason, peerResult, request string, err error) {
	if t.end(outcomeDropped, reason) && w.cfg.Peer != nil {
		w.cfg.Peer.count(peerResult)
	}
	if reason == HintMalformed && w.hintWarned.CompareAndSwap(false, true) {
		w.log.Warn("malformed KV hint ignored; the request is computed locally (logged once)", "request", request, "err", err)
	}
}

// A hint ticket makes every hint the worker takes end in exactly one
// counted outcome. The worker opens one for each hinted request and passes
// it down in the request's context; the Peer's fetcher (the sim's) settles
// it when the engine consults the hint, the worker when it drops the hint,
// when an engine that does not report use accepts the request, and when
// the stream ends. Whoever settles first counts; the others count nothing.
type hintTicket struct {
	settled  atomic.Bool
	outcomes *prometheus.CounterVec
}

// end settles t with outcome and reason; false when it was settled before.
func (t *hintTicket) end(outcome, reason string) bool {
	if t == nil || !t.settled.CompareAndSwap(false, true) {
		return false
	}
	t.outcomes.WithLabelValues(outcome, reason).Inc()
	return true
}

type ticketKey struct{}

func withHintTicket(ctx context.Context, t *hintTicket) context.Context {
	return context.WithValue(ctx, ticketKey{}, t)
}

// HintEnded counts the fetcher's result (HintFetched, HintPartial,
// HintFallback or HintUnused) for the request whose context is ctx
// (directly when no worker opened a ticket: the engine used on its own).
func (p *Peer) HintEnded(ctx context.Context, result string) {
	if t, ok := ctx.Value(ticketKey{}).(*hintTicket); ok {
		outcome := outcomeDelivered
		if result == HintFallback {
			outcome = outcomeFailed
		}
		if !t.end(outcome, result) {
			return
		}
	}
	p.count(result)
}

// settleHint closes t when its stream ended with result: an engine that
// finished the request without consulting the hint had nothing to fetch
// (delivered, unused); any other end failed it before the engine took it.
func (w *Worker) settleHint(t *hintTicket, result string) {
	p := w.cfg.Peer
	if result == resultFinished {
		if t.end(outcomeDelivered, HintUnused) && p != nil {
			p.count(HintUnused)
		}
		return
	}
	if t.end(outcomeFailed, reasonRequestEnded) && p != nil {
		p.count(HintDropped)
	}
}
