package mockengine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/hints"
	"github.com/kvmesh/kvmesh/kv"
)

// maxBody bounds a request body (a long prompt as token ids is ~10 bytes a
// token).
const maxBody = 64 << 20

func readBody(r *http.Request) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("cannot read the request body: %w", err)
	}
	return b, nil
}

// vllmRequest is the union of the completion and chat request fields the
// stand-in reads, vLLM's own besides the common ones; unknown fields are
// ignored, as vLLM ignores them.
type vllmRequest struct {
	openAIRequest
	ReturnTokenIDs   bool            `json:"return_token_ids"`
	Seed             *int64          `json:"seed"`
	CacheSalt        *string         `json:"cache_salt"`
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	KVHints          json.RawMessage `json:"kv_hints"`
	RequestID        string          `json:"request_id"`
}

// openAIRequest are the completion and chat request fields both OpenAI
// stand-ins (vLLM, TensorRT-LLM) read.
type openAIRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            []chatMessage   `json:"messages"`
	MaxTokens           json.RawMessage `json:"max_tokens"`
	MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
	MinTokens           int             `json:"min_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	IgnoreEOS           bool            `json:"ignore_eos"`
	StopTokenIDs        []int64         `json:"stop_token_ids"`
	N                   *int            `json:"n"`
	Echo                bool            `json:"echo"`
	Logprobs            json.RawMessage `json:"logprobs"`
}

// maxTokens is the output bound's field as given: chat's
// max_completion_tokens wins over the older max_tokens.
func (q *openAIRequest) maxTokens(chat bool) json.RawMessage {
	if chat && !isNull(q.MaxCompletionTokens) {
		return q.MaxCompletionTokens
	}
	return q.MaxTokens
}

// openAISampling is an OpenAI request's sampling: temperature 1 unless
// set, top_p as set, the seed (seedFor), min_tokens, and the stop tokens
// (stopTokens; stop_token_ids also come back as a set).
func openAISampling[S int64 | uint64](c *core, q *openAIRequest, seed *S, maxTokens int) (kv.Sampling, map[kv.Token]bool, error) {
	s := kv.Sampling{MaxTokens: maxTokens, MinTokens: q.MinTokens, Temperature: 1}
	if q.Temperature != nil {
		s.Temperature = *q.Temperature
	}
	if q.TopP != nil {
		s.TopP = *q.TopP
	}
	s.Seed = seedFor(seed, s.Temperature)
	stopTokens, stops, err := c.stopTokens(q.IgnoreEOS, q.StopTokenIDs)
	s.StopTokens = stopTokens
	return s, stops, err
}

type streamOptions struct {
	IncludeUsage         *bool `json:"include_usage"`
	ContinuousUsageStats bool  `json:"continuous_usage_stats"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Name    string          `json:"name"`
}

// openAIJob is what an OpenAI request comes to in either stand-in (vLLM,
// TensorRT-LLM).
type openAIJob struct {
	chat      bool
	prompt    []kv.Token
	maxTokens int
	stream    bool
	usage     bool // stream_options.include_usage (the default is the engine's)
	req       *engine.Request
	stopIDs   map[kv.Token]bool // stop_token_ids
}

// stopReason is what a choice that ended by f, its output toks, reports as
// stop_reason: the stop token when it was one of stop_token_ids, else
// null (an EOS stop, or no stop).
func (j *openAIJob) stopReason(f kv.FinishReason, toks []kv.Token) any {
	if f == kv.FinishStop && len(toks) > 0 && j.stopIDs[toks[len(toks)-1]] {
		return toks[len(toks)-1]
	}
	return nil
}

// job is a validated vLLM request, ready for the engine.
type job struct {
	openAIJob
	respID      string // "cmpl-…" / "chatcmpl-…"
	internalID  string // the engine's request id (remote_request_id)
	rank        int
	salt        string
	model, lora string        // the model named (the served one, or an adapter) and the adapter
	tokenIDs    bool          // return_token_ids
	prefill     bool          // kv_transfer_params.do_remote_decode
	decode      *decodeParams // a usable do_remote_prefill handoff
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

// idList decodes a JSON list of integers, the shape of every token-id
// prompt kvmesh sends, without encoding/json's reflection (tens of ms on a
// 64k-token prompt, which would count as the engine's time). ok is false
// for anything else, which the caller then decodes as before.
func idList(raw json.RawMessage) (ids []int64, ok bool) {
	b := bytes.TrimSpace(raw)
	if len(b) < 2 || b[0] != '[' || b[len(b)-1] != ']' {
		return nil, false
	}
	b = bytes.TrimSpace(b[1 : len(b)-1])
	if len(b) == 0 {
		return []int64{}, true
	}
	ids = make([]int64, 0, len(b)/4+1)
	for i := 0; i < len(b); {
		for i < len(b) && isSpace(b[i]) {
			i++
		}
		if i == len(b) {
			return nil, false // a trailing comma is not JSON
		}
		neg := b[i] == '-'
		if neg {
			i++
		}
		start := i
		var v int64
		for i < len(b) && b[i] >= '0' && b[i] <= '9' && i-start < 18 {
			v = v*10 + int64(b[i]-'0')
			i++
		}
		if i == start || (b[start] == '0' && i-start > 1) || (i < len(b) && b[i] >= '0' && b[i] <= '9') {
			return nil, false // not a number, a leading zero, or too long: the slow path says
		}
		if neg {
			v = -v
		}
		ids = append(ids, v)
		for i < len(b) && isSpace(b[i]) {
			i++
		}
		if i == len(b) {
			return ids, true
		}
		if b[i] != ',' {
			return nil, false
		}
		i++
	}
	return nil, false // ended on a comma
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// isString reports whether raw is a JSON string. A prompt is decoded as
// text only then: a failed string decode of a list of 64k token ids would
// scan all of it for nothing (engines take kvmesh's ids at their cost).
func isString(raw json.RawMessage) bool {
	t := bytes.TrimLeft(raw, " \t\r\n")
	return len(t) > 0 && t[0] == '"'
}

// parse reads and validates a request into a job.
func (v *VLLM) parse(r *http.Request, chat bool) (*job, *APIError) {
	body, err := readBody(r)
	if err != nil {
		return nil, badRequest(err.Error(), "")
	}
	var q vllmRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&q); err != nil {
		return nil, badRequest("invalid request body: "+err.Error(), "")
	}
	j := &job{openAIJob: openAIJob{chat: chat, stream: q.Stream}, tokenIDs: q.ReturnTokenIDs, model: v.cfg.Sim.Model}
	if q.Model != "" && q.Model != v.cfg.Sim.Model {
		// vLLM serves a LoRA adapter under its own name, its blocks hashed
		// with the adapter (lora_name in the KV events).
		if !slices.Contains(v.cfg.LoRAs, q.Model) {
			return nil, &APIError{Status: http.StatusNotFound, Message: fmt.Sprintf("The model `%s` does not exist.", q.Model), Param: "model"}
		}
		j.model, j.lora = q.Model, q.Model
	}
	switch {
	case q.N != nil && *q.N != 1:
		return nil, badRequest("n other than 1 is not supported by the kvmesh mock engine", "n")
	case q.Echo:
		return nil, badRequest("echo is not supported by the kvmesh mock engine", "echo")
	case !isNull(q.Logprobs) && !bytes.Equal(bytes.TrimSpace(q.Logprobs), []byte("false")):
		return nil, badRequest("logprobs are not supported by the kvmesh mock engine", "logprobs")
	case q.StreamOptions != nil && !q.Stream:
		return nil, badRequest("Stream options can only be defined when `stream=True`.", "stream_options")
	case q.Temperature != nil && (*q.Temperature < 0 || math.IsNaN(*q.Temperature)):
		return nil, badRequest(fmt.Sprintf("temperature must be non-negative, got %v.", *q.Temperature), "temperature")
	case q.TopP != nil && !(*q.TopP > 0 && *q.TopP <= 1):
		return nil, badRequest(fmt.Sprintf("top_p must be in (0, 1], got %v.", *q.TopP), "top_p")
	case q.MinTokens < 0:
		return nil, badRequest(fmt.Sprintf("min_tokens must be greater than or equal to 0, got %d.", q.MinTokens), "min_tokens")
	case q.CacheSalt != nil && *q.CacheSalt == "":
		return nil, badRequest("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt")
	}
	if q.StreamOptions != nil && q.StreamOptions.IncludeUsage != nil {
		j.usage = *q.StreamOptions.IncludeUsage
	}
	if q.CacheSalt != nil {
		j.salt = *q.CacheSalt
	}

	// The prompt.
	if chat {
		if j.prompt, err = v.renderChat(q.Messages); err != nil {
			return nil, badRequest(err.Error(), "messages")
		}
	} else if j.prompt, err = v.promptTokens(q.Prompt); err != nil {
		var ae *APIError
		if errors.As(err, &ae) {
			return nil, ae
		}
		return nil, badRequest(err.Error(), "prompt")
	}
	if len(j.prompt) >= v.maxLen {
		return nil, badRequest(fmt.Sprintf("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.",
			v.maxLen, len(j.prompt)), "input_tokens")
	}

	// max_tokens: completions default to 16 when absent; null (and chat's
	// absent) means whatever the context leaves.
	room := v.maxLen - len(j.prompt)
	raw := q.maxTokens(chat)
	j.maxTokens = room
	switch {
	case len(raw) == 0 && !chat:
		j.maxTokens = min(16, room)
	case !isNull(raw):
		n, err := strconv.Atoi(string(bytes.TrimSpace(raw)))
		if err != nil {
			return nil, badRequest("max_tokens must be an integer", "max_tokens")
		}
		if n < 1 {
			return nil, badRequest(fmt.Sprintf("max_tokens must be at least 1, got %d.", n), "max_tokens")
		}
		j.maxTokens = min(n, room)
	}
	if q.MinTokens > j.maxTokens {
		return nil, badRequest(fmt.Sprintf("min_tokens must be less than or equal to max_tokens=%d, got %d.", j.maxTokens, q.MinTokens), "min_tokens")
	}

	// Identity: X-Request-Id, else the body's request_id, else random.
	base := r.Header.Get("X-Request-Id")
	if base == "" {
		base = q.RequestID
	}
	if base == "" {
		base = randomHex(32)
	}
	if chat {
		j.respID = "chatcmpl-" + base
		j.internalID = j.respID + "-" + randomHex(8)
	} else {
		j.respID = "cmpl-" + base
		j.internalID = j.respID + "-0-" + randomHex(8)
	}

	// Data-parallel rank: the header a router sets, else the least loaded.
	if h := r.Header.Get("X-data-parallel-rank"); h != "" {
		rank, err := strconv.Atoi(h)
		if err != nil || rank < 0 || rank >= v.eng.DPSize() {
			return nil, badRequest(fmt.Sprintf("X-data-parallel-rank %q: want 0 to %d", h, v.eng.DPSize()-1), "")
		}
		j.rank = rank
	} else {
		j.rank = v.leastLoaded()
	}

	// Hints: the native field, and the bridge form inside the connector's
	// parameters.
	var params map[string]json.RawMessage
	if !isNull(q.KVTransferParams) {
		if err := json.Unmarshal(q.KVTransferParams, &params); err != nil {
			return nil, badRequest("kv_transfer_params must be an object: "+err.Error(), "kv_transfer_params")
		}
	}
	if !isNull(q.KVHints) {
		if ae := v.recordHint(j.internalID, "kv_hints", q.KVHints); ae != nil {
			return nil, ae
		}
	}
	if raw, ok := params["kv_hint"]; ok && !isNull(raw) {
		if ae := v.recordHint(j.internalID, "kv_transfer_params.kv_hint", raw); ae != nil {
			return nil, ae
		}
	}
	if params != nil && v.cfg.KVTransfer != nil {
		if ae := v.connectorParams(j, params); ae != nil {
			return nil, ae
		}
	}

	// Sampling (seedFor says how the sim's output varies).
	// Stop tokens are held back until min_tokens by the sim itself. vLLM's
	// ignore_eos drops only the EOS token; stop_token_ids still stop.
	sampling, stops, err := openAISampling(&v.core, &q.openAIRequest, q.Seed, j.maxTokens)
	if err != nil {
		return nil, badRequest(err.Error(), "stop_token_ids")
	}
	j.stopIDs = stops
	req := &engine.Request{ID: j.internalID, Tokens: j.prompt, Sampling: sampling, LoRA: j.lora, CacheSalt: j.salt, DPRank: j.rank}
	if !isNull(q.KVHints) {
		// Recorded and validated above; the engine takes the typed form.
		if env, err := hints.Parse(q.KVHints); err == nil {
			if h, ok := env.Hint(); ok {
				req.KVHint = h
			}
		}
	}
	j.req = req
	return j, nil
}

// promptTokens reads a completion prompt: text, token ids, or a batch of
// one of either.
func (v *VLLM) promptTokens(raw json.RawMessage) ([]kv.Token, error) {
	if isNull(raw) {
		return nil, badRequest("prompt is required", "prompt")
	}
	var text string
	if isString(raw) && json.Unmarshal(raw, &text) == nil {
		if text == "" {
			return nil, badRequest("The prompt cannot be empty.", "prompt")
		}
		return v.tok.Encode(text), nil
	}
	if ids, ok := idList(raw); ok {
		return v.checkIDs(ids)
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		return v.checkIDs(ids)
	}
	var batchIDs [][]int64
	if json.Unmarshal(raw, &batchIDs) == nil {
		if len(batchIDs) != 1 {
			return nil, badRequest(fmt.Sprintf("a batch of %d prompts is not supported by the kvmesh mock engine (send one)", len(batchIDs)), "prompt")
		}
		return v.checkIDs(batchIDs[0])
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil {
		if len(texts) != 1 {
			return nil, badRequest(fmt.Sprintf("a batch of %d prompts is not supported by the kvmesh mock engine (send one)", len(texts)), "prompt")
		}
		return v.promptTokens(json.RawMessage(strconv.Quote(texts[0])))
	}
	return nil, badRequest("prompt must be a string, a list of token ids, or a list of one of either", "prompt")
}

func (v *VLLM) checkIDs(ids []int64) ([]kv.Token, error) {
	if len(ids) == 0 {
		return nil, badRequest("The prompt cannot be empty.", "prompt")
	}
	out, bad, ok := v.tokenIDs(ids)
	if !ok {
		return nil, badRequest(fmt.Sprintf("Token id %d is out of vocabulary", bad), "prompt")
	}
	return out, nil
}

// messageText reads content as a string or a list of text parts.
func messageText(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("want a string or a list of content parts")
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("content part of type %q is not supported by the kvmesh mock engine", p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

func (v *VLLM) leastLoaded() int {
	best, load := 0, -1
	for r := range v.eng.DPSize() {
		s := v.eng.RankStats(r)
		if l := s.Running + s.Waiting; load < 0 || l < load {
			best, load = r, l
		}
	}
	return best
}

// HintRecord is one kv_hints envelope the stand-in received.
type HintRecord struct {
	RequestID string          `json:"request_id"`
	Field     string          `json:"field"` // "kv_hints", "kv_transfer_params.kv_hint" or (SGLang) "kv_router_hint"
	Envelope  json.RawMessage `json:"envelope"`
	MessageID string          `json:"message_id"`
	Actions   int             `json:"actions"`
	// SourceEndpoint and BlockHashes are the first kv.fetch action's.
	SourceEndpoint string   `json:"source_endpoint,omitempty"`
	BlockHashes    []uint64 `json:"block_hashes,omitempty"`
	// SignedHashes are an SGLang kv_router_hint's integer hashes read as
	// signed 64-bit, SGLang's own domain (BlockHashes are the same bits).
	SignedHashes []int64 `json:"signed_block_hashes,omitempty"`
	// Ignored: the protocol_version is not understood (hints.ErrIgnored).
	Ignored bool `json:"ignored,omitempty"`
}

// hintLog keeps the last max records.
type hintLog struct {
	mu   sync.Mutex
	max  int
	recs []HintRecord
}

// recordHint validates a hint envelope with package hints and records it;
// a malformed one is a 400, as vLLM's request validation rejects it.
func (v *VLLM) recordHint(reqID, field string, raw json.RawMessage) *APIError {
	env, err := hints.Parse(raw)
	rec := HintRecord{RequestID: reqID, Field: field, Envelope: append(json.RawMessage(nil), raw...)}
	switch {
	case errors.Is(err, hints.ErrIgnored):
		rec.Ignored = true
	case err != nil:
		return badRequest(fmt.Sprintf("%s: %v", field, err), field)
	default:
		rec.MessageID, rec.Actions = env.MessageID, len(env.Actions)
		if f, ok := env.Fetch(); ok {
			rec.SourceEndpoint, rec.BlockHashes = f.SourceEndpoint, f.BlockHashes
		}
	}
	v.hints.add(rec)
	return nil
}

func (h *hintLog) add(r HintRecord) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.recs) >= h.max {
		h.recs = append(h.recs[:0], h.recs[1:]...)
	}
	h.recs = append(h.recs, r)
}

// Hints returns the recorded kv_hints, oldest first (also served at
// GET /debug/kv_hints).
func (v *VLLM) Hints() []HintRecord {
	v.hints.mu.Lock()
	defer v.hints.mu.Unlock()
	return append([]HintRecord(nil), v.hints.recs...)
}
