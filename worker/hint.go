package worker

import (
	"errors"

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
func (w *Worker) admitHint(req *api.GenerateRequest) *kv.Hint {
	var h *kv.Hint
	if req.KvFetch != nil {
		h = api.HintFromProto(req.KvFetch)
	} else {
		env, err := hints.Parse(req.KvHint)
		switch {
		case errors.Is(err, hints.ErrIgnored):
			w.hintEnded(HintIgnored, req.RequestId, nil)
			return nil
		case err != nil:
			w.hintEnded(HintMalformed, req.RequestId, err)
			return nil
		}
		var ok bool
		if h, ok = env.Hint(); !ok {
			w.hintEnded(HintUnused, req.RequestId, nil)
			return nil
		}
	}
	if err := hints.CheckHint(h, kv.NumFullBlocks(len(req.Tokens), w.blockSize)); err != nil {
		w.hintEnded(HintMalformed, req.RequestId, err)
		return nil
	}
	return h
}

// hintEnded counts a hint the engine never sees; a malformed one is logged
// (once per worker: a misbehaving router would send many).
func (w *Worker) hintEnded(result, request string, err error) {
	if p := w.cfg.Peer; p != nil {
		p.count(result)
	}
	if result == HintMalformed && w.hintWarned.CompareAndSwap(false, true) {
		w.log.Warn("malformed KV hint ignored; the request is computed locally (logged once)", "request", request, "err", err)
	}
}
