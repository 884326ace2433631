package mockengine

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/kvmesh/kvmesh/kv"
)

// Disaggregated serving the TensorRT-LLM way: a context_only request
// computes the prompt and its first token, keeps the prompt's blocks under
// a lease and answers with disaggregated_params whose
// encoded_opaque_state names them (here: base64 of a small JSON naming
// this server's cache transceiver and the blocks' pool ids, where
// TensorRT-LLM puts its transceiver's state); a generation_only request
// carrying those parameters pulls the blocks' bytes from the context
// server, verifies and inserts them, notifies it (which frees the lease)
// and generates on from the first tokens. A lease no generation consumes
// runs out.

// disaggFields are TensorRT-LLM's DisaggregatedParams fields (extra
// fields are refused there, and here).
var disaggFields = map[string]bool{"request_type": true, "first_gen_tokens": true, "first_gen_log_probs": true,
	"first_gen_logits": true, "ctx_request_id": true, "encoded_opaque_state": true, "draft_tokens": true,
	"disagg_request_id": true, "ctx_dp_rank": true, "ctx_info_endpoint": true, "schedule_style": true,
	"ctx_usage": true, "return_prompt_token_ids_b64": true, "resolved_thinking": true}

// trtOpaque is what the stand-in's encoded_opaque_state carries.
type trtOpaque struct {
	EngineID  string  `json:"engine_id"`
	Host      string  `json:"host"`
	Port      int     `json:"port"`
	RequestID string  `json:"request_id"`
	BlockIDs  []int32 `json:"block_ids"`
}

// trtCtxParams is a context answer's disaggregated_params, every field of
// TensorRT-LLM's model.
type trtCtxParams struct {
	RequestType        string     `json:"request_type"`
	FirstGenTokens     []kv.Token `json:"first_gen_tokens"`
	FirstGenLogProbs   any        `json:"first_gen_log_probs"`
	FirstGenLogits     any        `json:"first_gen_logits"`
	CtxRequestID       int64      `json:"ctx_request_id"`
	EncodedOpaqueState *string    `json:"encoded_opaque_state"`
	DraftTokens        any        `json:"draft_tokens"`
	DisaggRequestID    *int64     `json:"disagg_request_id"`
	CtxDPRank          int        `json:"ctx_dp_rank"`
	CtxInfoEndpoint    any        `json:"ctx_info_endpoint"`
	ScheduleStyle      any        `json:"schedule_style"`
	CtxUsage           any        `json:"ctx_usage"`
}

// DisaggRecord is one disaggregated request the stand-in saw: the
// parameters a context_only answer carried, or a generation_only request
// received (GET /debug/disaggregated_params; mock only).
type DisaggRecord struct {
	RequestType string          `json:"request_type"`
	Params      json.RawMessage `json:"params"`
	Prompt      []kv.Token      `json:"prompt"`
}

func (t *TRTLLM) record(r DisaggRecord) {
	t.recMu.Lock()
	defer t.recMu.Unlock()
	if len(t.records) >= 1024 {
		t.records = append(t.records[:0], t.records[1:]...)
	}
	t.records = append(t.records, r)
}

// DisaggRecords returns what record kept, oldest first.
func (t *TRTLLM) DisaggRecords() []DisaggRecord {
	t.recMu.Lock()
	defer t.recMu.Unlock()
	return append([]DisaggRecord(nil), t.records...)
}

func (t *TRTLLM) disaggParams(j *trtJob, raw json.RawMessage) (int, string) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return http.StatusBadRequest, "disaggregated_params must be an object"
	}
	for k := range fields {
		if !disaggFields[k] {
			return http.StatusBadRequest, "disaggregated_params." + k + ": Extra inputs are not permitted"
		}
	}
	var d trtDisagg
	if err := json.Unmarshal(raw, &d); err != nil {
		return http.StatusBadRequest, "disaggregated_params: " + err.Error()
	}
	j.disagg = &d
	switch d.RequestType {
	case "context_and_generation":
		return 0, ""
	case "context_only", "generation_only":
	default:
		return http.StatusBadRequest, "disaggregated_params.request_type " + strconv.Quote(d.RequestType) + ": want context_only, generation_only or context_and_generation"
	}
	if t.cfg.Transceiver == nil {
		return http.StatusBadRequest, "disaggregated serving needs a cache transceiver (cache_transceiver_config)"
	}
	if d.RequestType == "context_only" {
		if j.stream {
			return http.StatusBadRequest, "a context_only request is not streamed"
		}
		// The context phase computes the prompt and the first token.
		j.req.MaxTokens, j.req.MinTokens = 1, 0
		return 0, ""
	}
	if len(d.FirstGenTokens) == 0 {
		return http.StatusBadRequest, "a generation_only request needs disaggregated_params.first_gen_tokens"
	}
	if d.EncodedOpaqueState == nil {
		return http.StatusBadRequest, "a generation_only request needs disaggregated_params.encoded_opaque_state"
	}
	b, err := base64.StdEncoding.DecodeString(*d.EncodedOpaqueState)
	var o trtOpaque
	if err != nil || json.Unmarshal(b, &o) != nil || o.Host == "" || o.Port <= 0 || o.Port > 65535 || o.RequestID == "" {
		return http.StatusBadRequest, "disaggregated_params.encoded_opaque_state is not a context state this server can read"
	}
	j.first = d.FirstGenTokens
	j.pull = &pullState{p: decodeParams{engineID: o.EngineID, requestID: o.RequestID, host: o.Host, port: o.Port, blockIDs: poolIDs(o.BlockIDs)}}
	t.record(DisaggRecord{RequestType: d.RequestType, Params: append(json.RawMessage(nil), raw...), Prompt: j.prompt})
	j.req.Tokens = append(append([]kv.Token(nil), j.prompt...), j.first...)
	j.req.MaxTokens = max(j.maxTokens-len(j.first), 0)
	j.req.MinTokens = max(j.req.MinTokens-len(j.first), 0)
	return 0, ""
}

// contextAnswer leases a context request's prompt blocks (when it goes on
// to a generation phase) and returns its disaggregated_params.
func (t *TRTLLM) contextAnswer(j *trtJob, tokens []kv.Token, fin string) *trtCtxParams {
	id, _ := strconv.ParseInt(j.id, 10, 64)
	p := &trtCtxParams{RequestType: "context_only", FirstGenTokens: tokens, CtxRequestID: id, DisaggRequestID: j.disagg.DisaggRequestID}
	if p.FirstGenTokens == nil {
		p.FirstGenTokens = []kv.Token{}
	}
	defer func() {
		b, _ := json.Marshal(p)
		t.record(DisaggRecord{RequestType: p.RequestType, Params: b, Prompt: j.prompt})
	}()
	if fin != "length" {
		return p // final: nothing to hand off
	}
	_, seqs := kv.NewHasher(t.cfg.Sim.BlockSize, j.req.LoRA, j.req.CacheSalt).Blocks(j.prompt)
	ids := t.leases[0].Grant(j.req.ID, kv.Seed(j.req.LoRA, j.req.CacheSalt), seqs)
	if ids == nil {
		ids = []int32{}
	}
	b, _ := json.Marshal(trtOpaque{EngineID: t.engID, Host: t.host, Port: t.sidePort(0), RequestID: j.req.ID, BlockIDs: ids})
	s := base64.StdEncoding.EncodeToString(b)
	p.EncodedOpaqueState = &s
	return p
}
