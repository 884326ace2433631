package worker

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/hints"
	"github.com/kvmesh/kvmesh/kv"
)

// admitHint is where a KV hint enters the worker: the typed kv_fetch, or
// else the legacy JSON kv_hint. It returns the hint the engine gets,
// validated (hints.CheckHint: a canonical endpoint, at least one hash, no
// more than the prompt's full blocks), or nil. A hint that ends here is
// counted through the Peer, if any: malformed, ignored (an envelope of an
// unknown protocol_version) or unused (an envelope naming no source).
func (w *Worker) admitHint(req *api.GenerateRequest, t *hintTicket) *kv.Hint {
	var h *kv.Hint
	if req.KvFetch != nil {
		h = api.HintFromProto(req.KvFetch)
	} else {
		env, err := w.hintParser.Parse(req.KvHint)
		switch {
		case errors.Is(err, hints.ErrIgnored):
			w.hintEnded(t, HintIgnored, req.RequestId, nil)
			return nil
		case err != nil:
			w.hintEnded(t, HintMalformed, req.RequestId, err)
			return nil
		}
		var ok bool
		if h, ok = env.Hint(); !ok {
			w.hintEnded(t, HintUnused, req.RequestId, nil)
			return nil
		}
	}
	if err := hints.CheckHint(h, kv.NumFullBlocks(len(req.Tokens), w.blockSize)); err != nil {
		w.hintEnded(t, HintMalformed, req.RequestId, err)
		return nil
	}
	return h
}

// hintEnded counts a hint the engine never sees (settling its ticket); a
// malformed one is logged (once per worker: a misbehaving router would send
// many).
func (w *Worker) hintEnded(t *hintTicket, result, request string, err error) {
	if p := w.cfg.Peer; p != nil && t != nil && t.settled.CompareAndSwap(false, true) {
		p.count(result)
	}
	if result == HintMalformed && w.hintWarned.CompareAndSwap(false, true) {
		w.log.Warn("malformed KV hint ignored; the request is computed locally (logged once)", "request", request, "err", err)
	}
}

// A hint ticket makes every hint the worker hands its engine end in
// exactly one counted result. The worker opens one before the engine sees
// the request and passes it down in the request's context; the Peer's
// fetcher settles it when the engine consults the hint, and the worker
// settles it when the stream ends. Whoever settles first counts; the other
// finds it settled and counts nothing.
type hintTicket struct{ settled atomic.Bool }

type ticketKey struct{}

func withHintTicket(ctx context.Context, t *hintTicket) context.Context {
	return context.WithValue(ctx, ticketKey{}, t)
}

// HintEnded counts the fetcher's result (HintFetched, HintPartial,
// HintFallback or HintUnused) for the request whose context is ctx
// (directly when no worker opened a ticket: the engine used on its own).
func (p *Peer) HintEnded(ctx context.Context, result string) {
	if t, ok := ctx.Value(ticketKey{}).(*hintTicket); ok && !t.settled.CompareAndSwap(false, true) {
		return
	}
	p.count(result)
}

// settle closes t when its stream ended with result: a request the engine
// finished without consulting the hint had nothing to fetch (unused); any
// other end dropped it.
func (p *Peer) settle(t *hintTicket, result string) {
	if !t.settled.CompareAndSwap(false, true) {
		return
	}
	if result == resultFinished {
		p.count(HintUnused)
	} else {
		p.count(HintDropped)
	}
}
