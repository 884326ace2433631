package kvbm

import "github.com/kvmesh/kvmesh/kv"

// TRTLLMLeader is the scheduler side in the shape of TensorRT-LLM's
// KvCacheConnectorScheduler, whose scheduler output carries, per request,
// new_tokens, new_block_ids, computed_position and num_scheduled_tokens.
type TRTLLMLeader struct{ c *Connector }

// TRTLLMLeader returns the TensorRT-LLM-shaped leader over c.
func (c *Connector) TRTLLMLeader() *TRTLLMLeader { return &TRTLLMLeader{c} }

// GetNumNewMatchedTokens is as VLLMLeader's; a generation-only request
// (the decode side of a disaggregated pair) matches nothing.
func (l *TRTLLMLeader) GetNumNewMatchedTokens(req *Request, numComputedTokens int) (int, bool, error) {
	return l.c.match(req, numComputedTokens)
}

// UpdateStateAfterAlloc records the request's blocks. TensorRT-LLM passes
// no external token count: the leader keeps the one it returned from the
// match, and the device-computed tokens are contextPosition (the request's
// context_current_position, device hits plus external tokens) minus it.
func (l *TRTLLMLeader) UpdateStateAfterAlloc(reqID string, blockIDs []DeviceBlockID, contextPosition int) error {
	ext := 0
	if s := l.c.slots[reqID]; s != nil && s.phase == PhaseOnboardStaged {
		ext = len(s.staged) * l.c.bs
	}
	return l.c.afterAlloc(reqID, blockIDs, ext, contextPosition-ext)
}

// TRTLLMRequestData is one request of a TensorRT-LLM scheduler step. New
// requests give their whole token and block lists, cached ones what came
// since the connector last saw them.
type TRTLLMRequestData struct {
	ID               string
	NewTokens        []kv.Token
	NewBlockIDs      []DeviceBlockID
	ComputedPosition int      // tokens whose KV is on the device before this step
	Req              *Request // new requests: the request, if never matched
	// A request given by hashes (Request.Len) gives, instead of NewTokens,
	// every token it knows by count and the local hashes of their full
	// blocks.
	Len   int
	Local []kv.LocalHash
}

// TRTLLMSchedulerOutput is a TensorRT-LLM scheduler step; every scheduled
// request must appear in NumScheduledTokens.
type TRTLLMSchedulerOutput struct {
	NewRequests        []TRTLLMRequestData
	CachedRequests     []TRTLLMRequestData
	NumScheduledTokens map[string]int
}

// BuildConnectorMeta drives ApplySchedulerOutput for every request of the
// step and returns the step's metadata.
func (l *TRTLLMLeader) BuildConnectorMeta(out *TRTLLMSchedulerOutput) (*Metadata, error) {
	steps := make([]sched, 0, len(out.NewRequests)+len(out.CachedRequests))
	for _, r := range out.NewRequests {
		steps = append(steps, sched{id: r.ID, isNew: true, req: r.Req, tokens: r.NewTokens, hlen: r.Len, local: r.Local,
			blocks: r.NewBlockIDs, numComputed: r.ComputedPosition})
	}
	for _, r := range out.CachedRequests {
		steps = append(steps, sched{id: r.ID, tokens: r.NewTokens, hlen: r.Len, local: r.Local,
			blocks: r.NewBlockIDs, numComputed: r.ComputedPosition})
	}
	return l.c.build(steps, out.NumScheduledTokens)
}

// RequestFinished reports whether the request's blocks must stay allocated
// until the worker reports its stores done (TensorRT-LLM's "async saving").
func (l *TRTLLMLeader) RequestFinished(reqID string, _ []DeviceBlockID) bool {
	return l.c.finished(reqID)
}
