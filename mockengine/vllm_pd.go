package mockengine

import (
	"encoding/json"

	"github.com/kvmesh/kvmesh/kv"
)

// prefillParams is the prefill response's top-level kv_transfer_params, in
// the order and with the fields of vLLM's pull-mode NixlConnector
// (request_finished). remote_blocks_expiry_time is null on a prefill node.
type prefillParams struct {
	DoRemotePrefill        bool      `json:"do_remote_prefill"`
	DoRemoteDecode         bool      `json:"do_remote_decode"`
	RemoteBlockIDs         [][]int32 `json:"remote_block_ids"`
	RemoteEngineID         string    `json:"remote_engine_id"`
	RemoteRequestID        string    `json:"remote_request_id"`
	RemoteHost             string    `json:"remote_host"`
	RemotePort             int       `json:"remote_port"`
	TPSize                 int       `json:"tp_size"`
	DCPSize                int       `json:"dcp_size"`
	PPSize                 int       `json:"pp_size"`
	RemoteNumTokens        int       `json:"remote_num_tokens"`
	RemoteBlocksExpiryTime *float64  `json:"remote_blocks_expiry_time"`
	TransferMode           string    `json:"transfer_mode"`
}

// connectorParams reads kv_transfer_params for the NixlConnector: a
// prefill leg (do_remote_decode) or a decode leg's handoff. A handoff that
// lacks remote_block_ids or any of remote_engine_id, remote_request_id,
// remote_host, remote_port is not pulled (vLLM warns and computes).
func (v *VLLM) connectorParams(j *job, params map[string]json.RawMessage) *APIError {
	var flag = func(k string) (bool, *APIError) {
		raw, ok := params[k]
		if !ok || isNull(raw) {
			return false, nil
		}
		var b bool
		if err := json.Unmarshal(raw, &b); err != nil {
			return false, badRequest("kv_transfer_params."+k+" must be a boolean", "kv_transfer_params")
		}
		return b, nil
	}
	dec, ae := flag("do_remote_decode")
	if ae != nil {
		return ae
	}
	pre, ae := flag("do_remote_prefill")
	if ae != nil {
		return ae
	}
	j.prefill = dec
	if !pre {
		return nil
	}
	var p decodeParams
	str := func(k string, dst *string) bool {
		raw, ok := params[k]
		return ok && !isNull(raw) && json.Unmarshal(raw, dst) == nil && *dst != ""
	}
	okFields := str("remote_engine_id", &p.engineID) && str("remote_request_id", &p.requestID) &&
		str("remote_host", &p.host)
	if raw, ok := params["remote_port"]; !ok || json.Unmarshal(raw, &p.port) != nil || p.port <= 0 || p.port > 65535 {
		okFields = false
	}
	ids, idsOK := blockIDs(params["remote_block_ids"])
	if !okFields || !idsOK {
		v.log.Warn("kv_transfer_params without a usable handoff; computing the prompt", "request", j.internalID)
		return nil
	}
	p.blockIDs = ids
	j.decode = &p
	return nil
}

// blockIDs reads remote_block_ids: a list of lists (one per KV-cache group,
// current vLLM; group 0 is used) or a flat list (older vLLM). ok is false
// when absent, empty or malformed.
func blockIDs(raw json.RawMessage) ([]int64, bool) {
	if isNull(raw) {
		return nil, false
	}
	var groups [][]int64
	if json.Unmarshal(raw, &groups) == nil {
		if len(groups) == 0 {
			return nil, false
		}
		return groups[0], true
	}
	var flat []int64
	if json.Unmarshal(raw, &flat) == nil && len(flat) > 0 {
		return flat, true
	}
	return nil, false
}

// grant pins a finished prefill's prompt blocks under a lease named by its
// request id and returns the kv_transfer_params its response carries.
func (v *VLLM) grant(j *job) *prefillParams {
	_, seqs := kv.NewHasher(v.cfg.Sim.BlockSize, j.lora, j.salt).Blocks(j.prompt)
	ids := v.leases[j.rank].Grant(j.internalID, kv.Seed(j.lora, j.salt), seqs)
	if ids == nil {
		ids = []int32{}
	}
	return &prefillParams{
		DoRemotePrefill: true,
		RemoteBlockIDs:  [][]int32{ids},
		RemoteEngineID:  v.engID,
		RemoteRequestID: j.internalID,
		RemoteHost:      v.host,
		RemotePort:      v.sides[j.rank].Port(),
		TPSize:          1,
		DCPSize:         1,
		PPSize:          1,
		RemoteNumTokens: len(ids) * v.cfg.Sim.BlockSize,
		TransferMode:    "pull",
	}
}
