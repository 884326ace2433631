package kvbm

import "github.com/kvmesh/kvmesh/kv"

// VLLMLeader is the scheduler side in the shape of vLLM's
// KVConnectorBase_V1 (get_num_new_matched_tokens, update_state_after_alloc,
// build_connector_meta, request_finished).
type VLLMLeader struct{ c *Connector }

// VLLMLeader returns the vLLM-shaped leader over c.
func (c *Connector) VLLMLeader() *VLLMLeader { return &VLLMLeader{c} }

// GetNumNewMatchedTokens returns how many tokens beyond the device's
// numComputedTokens the host and disk tiers can supply, and whether they
// load asynchronously (true whenever the count is > 0).
func (l *VLLMLeader) GetNumNewMatchedTokens(req *Request, numComputedTokens int) (int, bool, error) {
	return l.c.match(req, numComputedTokens)
}

// UpdateStateAfterAlloc records the blocks the engine allocated for the
// request (its device hits and the blocks for the external tokens first).
// With numExternalTokens > 0 it issues the load of the staged blocks into
// the blocks right after the device hits; vLLM calls it again after an
// async load with 0 external tokens, which only adds blocks.
func (l *VLLMLeader) UpdateStateAfterAlloc(reqID string, blockIDs []DeviceBlockID, numExternalTokens int) error {
	return l.c.afterAlloc(reqID, blockIDs, numExternalTokens, len(blockIDs)*l.c.bs-numExternalTokens)
}

// VLLMNewRequest is a request scheduled for the first time (or resumed,
// in vLLM ≥ 0.14): its whole prompt and block list.
type VLLMNewRequest struct {
	Req               *Request
	BlockIDs          []DeviceBlockID
	NumComputedTokens int
}

// VLLMCachedRequest is a request scheduled again: the tokens sampled and
// blocks allocated since the connector last saw it. After a preemption
// NewBlockIDs is its whole block list.
type VLLMCachedRequest struct {
	ID                    string
	ResumedFromPreemption bool
	NewTokenIDs           []kv.Token
	NewBlockIDs           []DeviceBlockID
	NumComputedTokens     int
}

// VLLMSchedulerOutput is the part of vLLM's SchedulerOutput the connector
// reads.
type VLLMSchedulerOutput struct {
	NewRequests        []VLLMNewRequest
	CachedRequests     []VLLMCachedRequest
	NumScheduledTokens map[string]int
}

// BuildConnectorMeta applies the step to every scheduled request's slot and
// returns the step's metadata for the worker: the loads issued since the
// last step and the stores of blocks this step's forward pass completes.
func (l *VLLMLeader) BuildConnectorMeta(out *VLLMSchedulerOutput) (*Metadata, error) {
	steps := make([]sched, 0, len(out.NewRequests)+len(out.CachedRequests))
	for _, r := range out.NewRequests {
		st := sched{isNew: true, req: r.Req, blocks: r.BlockIDs, numComputed: r.NumComputedTokens}
		if r.Req != nil {
			st.id, st.tokens = r.Req.ID, r.Req.Tokens
		}
		steps = append(steps, st)
	}
	for _, r := range out.CachedRequests {
		steps = append(steps, sched{id: r.ID, resumed: r.ResumedFromPreemption, tokens: r.NewTokenIDs,
			blocks: r.NewBlockIDs, numComputed: r.NumComputedTokens})
	}
	return l.c.build(steps, out.NumScheduledTokens)
}

// RequestFinished reports whether the engine must delay freeing the
// request's blocks: true while its ops are in flight; the worker's
// GetFinished then reports it finished sending.
func (l *VLLMLeader) RequestFinished(reqID string, _ []DeviceBlockID) bool {
	return l.c.finished(reqID)
}
