package mockengine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/tokenizer"
)

func (t *TRTLLM) trtRoutes() {
	m := http.NewServeMux()
	m.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { t.serveGenerate(w, r, false) })
	m.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { t.serveGenerate(w, r, true) })
	m.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{map[string]any{
			"id": t.cfg.Sim.Model, "object": "model", "created": t.created, "owned_by": "tensorrt_llm"}}})
	})
	serveHealthAndVersion(m, &t.closed, TRTLLMVersion)
	m.HandleFunc("GET /metrics", t.serveIterStats)
	m.HandleFunc("POST /kv_cache_events", t.serveEvents)
	m.HandleFunc("GET /debug/disaggregated_params", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"records": t.DisaggRecords(), "leases": t.LeaseStats(), "pulls": t.PullStats(),
			"kvbm": t.eng.KVBMStats()})
	})
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeTRTError(w, http.StatusNotFound, "Not Found")
	})
	t.mux = m
}

// trtError is TensorRT-LLM's ErrorResponse: flat, not OpenAI's nested
// shape.
type trtError struct {
	Object  string  `json:"object"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

func trtErrorJSON(status int, msg string) []byte {
	b, _ := json.Marshal(trtError{Object: "error", Message: msg, Type: errorType(status), Code: status})
	return b
}

func writeTRTError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(trtErrorJSON(status, msg))
}

// serveIterStats is /metrics: the iteration stats queued since the last
// read (one entry here, when the engine did anything since), or [] when
// enable_iter_perf_stats is off. The engine's start counts as an
// iteration, as a real engine's warm-up does.
func (t *TRTLLM) serveIterStats(w http.ResponseWriter, _ *http.Request) {
	out := []any{}
	if t.cfg.IterPerfStats {
		s := t.eng.Stats()
		c := t.eng.Counters()
		mark := c.PromptTokens + c.OutputTokens + uint64(s.Running) + uint64(s.Waiting)
		t.statMu.Lock()
		fresh := !t.statSeen || mark != t.lastMark || s.Running+s.Waiting > 0
		t.statSeen, t.lastMark = true, mark
		if fresh {
			t.iter++
		}
		iter := t.iter
		t.statMu.Unlock()
		if fresh {
			hit := 0.0
			if c.PromptTokens > 0 {
				hit = float64(c.CachedTokens) / float64(c.PromptTokens)
			}
			out = append(out, map[string]any{
				"iter": iter, "iterLatencyMS": 0.0, "gpuMemUsage": 0, "timestamp": time.Now().UTC().Format("01-02-2006 15:04:05"),
				"numActiveRequests": s.Running, "numQueuedRequests": s.Waiting, "numCompletedRequests": 0,
				"maxNumActiveRequests": t.cfg.Sim.MaxSeqs, "maxBatchSizeStatic": t.cfg.Sim.MaxSeqs, "maxNumTokensStatic": t.cfg.Sim.MaxBatchedTokens,
				"kvCacheStats": map[string]any{"maxNumBlocks": s.TotalBlocks, "freeNumBlocks": s.TotalBlocks - s.UsedBlocks,
					"usedNumBlocks": s.UsedBlocks, "tokensPerBlock": t.cfg.Sim.BlockSize, "allocTotalBlocks": s.UsedBlocks,
					"allocNewBlocks": 0, "reusedBlocks": 0, "missedBlocks": 0, "cacheHitRate": hit},
			})
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// completionFields are TensorRT-LLM's CompletionRequest fields: its models
// forbid any other (pydantic extra="forbid"), and so does the stand-in.
var completionFields = map[string]bool{}

func init() {
	for _, f := range strings.Fields(`model prompt best_of echo frequency_penalty logit_bias logprobs max_tokens n
		presence_penalty seed stop stream stream_options suffix temperature top_p user lora_request prompt_ignore_length
		use_beam_search top_k top_p_min min_p repetition_penalty length_penalty early_stopping stop_token_ids
		include_stop_str_in_output ignore_eos min_tokens skip_special_tokens spaces_between_special_tokens
		truncate_prompt_tokens return_context_logits detokenize thinking_token_budget add_special_tokens
		response_format disaggregated_params priority conversation_params`) {
		completionFields[f] = true
	}
}

// topLevelKeys lists the keys of body's outer object without decoding its
// values: a prompt of token ids is most of the body, and decoding it twice
// (once for this check, once into the request) was most of the stand-in's
// parse. A malformed body yields what it yields; the decode that follows
// reports it.
func topLevelKeys(body []byte) []string {
	var keys []string
	depth, inStr, esc, start := 0, false, false, 0
	expectKey := false
	for i, c := range body {
		if inStr {
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
				if depth == 1 && expectKey {
					var k string
					if json.Unmarshal(body[start:i+1], &k) == nil {
						keys = append(keys, k)
					}
					expectKey = false
				}
			}
			continue
		}
		switch c {
		case '"':
			inStr, start = true, i
		case '{', '[':
			depth++
			expectKey = depth == 1 && c == '{'
		case '}', ']':
			depth--
		case ',':
			expectKey = depth == 1
		}
	}
	return keys
}

type trtRequest struct {
	openAIRequest
	Seed                *uint64         `json:"seed"`
	Stop                json.RawMessage `json:"stop"`
	BestOf              *int            `json:"best_of"`
	UseBeamSearch       bool            `json:"use_beam_search"`
	LoRARequest         json.RawMessage `json:"lora_request"`
	Detokenize          *bool           `json:"detokenize"`
	DisaggregatedParams json.RawMessage `json:"disaggregated_params"`
}

// trtDisagg is a request's disaggregated_params, as TensorRT-LLM's
// DisaggregatedParams model has them.
type trtDisagg struct {
	RequestType        string     `json:"request_type"`
	FirstGenTokens     []kv.Token `json:"first_gen_tokens"`
	CtxRequestID       *int64     `json:"ctx_request_id"`
	EncodedOpaqueState *string    `json:"encoded_opaque_state"`
	DraftTokens        []kv.Token `json:"draft_tokens"`
	DisaggRequestID    *int64     `json:"disagg_request_id"`
	CtxDPRank          *int       `json:"ctx_dp_rank"`
	CtxInfoEndpoint    *string    `json:"ctx_info_endpoint"`
}

type trtJob struct {
	openAIJob
	id     string
	detok  bool
	disagg *trtDisagg
	first  []kv.Token // generation_only: the context's first tokens
	pull   *pullState // generation_only: where the context's blocks are
}

func (t *TRTLLM) parse(r *http.Request, chat bool) (*trtJob, int, string) {
	body, err := readBody(r)
	if err != nil {
		return nil, http.StatusBadRequest, err.Error()
	}
	if !chat {
		var extra []string
		for _, k := range topLevelKeys(body) {
			if !completionFields[k] {
				extra = append(extra, k)
			}
		}
		if len(extra) > 0 {
			sort.Strings(extra)
			return nil, http.StatusBadRequest, fmt.Sprintf("1 validation error for CompletionRequest\n%s\n  Extra inputs are not permitted [type=extra_forbidden]", strings.Join(extra, ", "))
		}
	}
	var q trtRequest
	if err := json.Unmarshal(body, &q); err != nil {
		return nil, http.StatusBadRequest, "invalid request body: " + err.Error()
	}
	if q.Model == "" {
		return nil, http.StatusBadRequest, "model: Field required"
	}
	if q.Model != t.cfg.Sim.Model {
		return nil, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", q.Model)
	}
	switch {
	case q.N != nil && *q.N != 1, q.BestOf != nil && *q.BestOf > 1, q.UseBeamSearch:
		return nil, http.StatusBadRequest, "n, best_of and beam search are not supported by the kvmesh mock engine"
	case q.Echo:
		return nil, http.StatusBadRequest, "echo is not supported by the kvmesh mock engine"
	case !isNull(q.Logprobs) && string(bytes.TrimSpace(q.Logprobs)) != "false" && string(bytes.TrimSpace(q.Logprobs)) != "0":
		return nil, http.StatusBadRequest, "logprobs are not supported by the kvmesh mock engine"
	case !isNull(q.LoRARequest):
		return nil, http.StatusBadRequest, "lora_request is not supported by the kvmesh mock engine"
	case !isNull(q.Stop) && string(bytes.TrimSpace(q.Stop)) != "[]" && string(bytes.TrimSpace(q.Stop)) != `""`:
		return nil, http.StatusBadRequest, "stop strings are not supported by the kvmesh mock engine (use stop_token_ids)"
	case q.StreamOptions != nil && !q.Stream:
		return nil, http.StatusBadRequest, "Stream options can only be defined when stream is true."
	case q.Temperature != nil && (*q.Temperature < 0 || math.IsNaN(*q.Temperature)):
		return nil, http.StatusBadRequest, fmt.Sprintf("temperature must be non-negative, got %v", *q.Temperature)
	case q.TopP != nil && !(*q.TopP > 0 && *q.TopP <= 1):
		return nil, http.StatusBadRequest, fmt.Sprintf("top_p must be in (0, 1], got %v", *q.TopP)
	case q.MinTokens < 0:
		return nil, http.StatusBadRequest, "min_tokens must be non-negative"
	}
	j := &trtJob{openAIJob: openAIJob{chat: chat, stream: q.Stream}, detok: q.Detokenize == nil || *q.Detokenize}
	if q.StreamOptions != nil {
		j.usage = q.StreamOptions.IncludeUsage == nil || *q.StreamOptions.IncludeUsage
	}
	if chat {
		j.prompt, err = t.renderChat(q.Messages)
	} else {
		j.prompt, err = t.prompt(q.Prompt)
	}
	if err != nil {
		return nil, http.StatusBadRequest, err.Error()
	}
	if len(j.prompt) >= t.maxLen {
		return nil, http.StatusBadRequest, fmt.Sprintf("The prompt length (%d) plus max_tokens exceeds max_seq_len (%d).", len(j.prompt), t.maxLen)
	}
	room := t.maxLen - len(j.prompt)
	raw := q.maxTokens(chat)
	j.maxTokens = room
	if !isNull(raw) {
		n, err := strconv.Atoi(string(bytes.TrimSpace(raw)))
		if err != nil || n < 1 {
			return nil, http.StatusBadRequest, "max_tokens must be a positive integer"
		}
		if n > room {
			return nil, http.StatusBadRequest, fmt.Sprintf("The prompt length (%d) plus max_tokens (%d) exceeds max_seq_len (%d).", len(j.prompt), n, t.maxLen)
		}
		j.maxTokens = n
	}
	if q.MinTokens > j.maxTokens {
		return nil, http.StatusBadRequest, "min_tokens must not exceed max_tokens"
	}
	j.id = fmt.Sprintf("%d", t.reqSeq.Add(1))
	sampling, stops, err := openAISampling(&t.core, &q.openAIRequest, q.Seed, j.maxTokens)
	if err != nil {
		return nil, http.StatusBadRequest, err.Error()
	}
	j.stopIDs = stops
	req := &engine.Request{ID: "trtllm-" + j.id + "-" + randomHex(8), Tokens: j.prompt, Sampling: sampling}
	j.req = req
	if !isNull(q.DisaggregatedParams) {
		if code, msg := t.disaggParams(j, q.DisaggregatedParams); code != 0 {
			return nil, code, msg
		}
	}
	return j, 0, ""
}

func (t *TRTLLM) prompt(raw json.RawMessage) ([]kv.Token, error) {
	if isNull(raw) {
		return nil, errors.New("prompt: Field required")
	}
	var text string
	if isString(raw) && json.Unmarshal(raw, &text) == nil {
		if text == "" {
			return nil, errors.New("the prompt cannot be empty")
		}
		return t.tok.Encode(text), nil
	}
	ids, ok := idList(raw)
	if !ok && json.Unmarshal(raw, &ids) != nil {
		var batch [][]int64
		if json.Unmarshal(raw, &batch) != nil || len(batch) != 1 {
			return nil, errors.New("prompt must be a string or a list of token ids (one prompt: the kvmesh mock engine takes no batches)")
		}
		ids = batch[0]
	}
	if len(ids) == 0 {
		return nil, errors.New("the prompt cannot be empty")
	}
	out, bad, ok := t.tokenIDs(ids)
	if !ok {
		return nil, fmt.Errorf("token id %d is out of vocabulary", bad)
	}
	return out, nil
}

// TensorRT-LLM's response shapes (exclude_unset=False: every field).

type trtChoice struct {
	Index               int        `json:"index"`
	Text                string     `json:"text"`
	TokenIDs            []kv.Token `json:"token_ids"`
	Logprobs            any        `json:"logprobs"`
	ContextLogits       any        `json:"context_logits,omitempty"`
	FinishReason        *string    `json:"finish_reason"`
	StopReason          any        `json:"stop_reason"`
	DisaggregatedParams any        `json:"disaggregated_params,omitempty"`
	AvgDecoded          any        `json:"avg_decoded_tokens_per_iter"`
}

type trtResp struct {
	respHead
	Choices        []trtChoice `json:"choices"`
	Usage          *usageInfo  `json:"usage"`
	PromptTokenIDs []kv.Token  `json:"prompt_token_ids,omitempty"`
}

type trtChatDelta struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

type trtChatChoice struct {
	Index   int           `json:"index"`
	Message *trtChatDelta `json:"message,omitempty"`
	Delta   *trtChatDelta `json:"delta,omitempty"`
	choiceEnd
}

type trtChatResp struct {
	respHead
	Choices []trtChatChoice `json:"choices"`
	Usage   *usageInfo      `json:"usage"`
}

func (t *TRTLLM) serveGenerate(w http.ResponseWriter, r *http.Request, chat bool) {
	if t.closed.Load() {
		writeTRTError(w, http.StatusServiceUnavailable, "The engine is shut down.")
		return
	}
	j, code, msg := t.parse(r, chat)
	if code != 0 {
		writeTRTError(w, code, msg)
		return
	}
	ctx := r.Context()
	ctxOnly := j.disagg != nil && j.disagg.RequestType == "context_only"
	var out <-chan engine.Chunk
	if j.pull != nil {
		t.pulls.Store(j.req.ID, j.pull)
		defer t.pulls.Delete(j.req.ID)
	}
	if j.req.MaxTokens > 0 {
		ch, code, err := t.generate(ctx, j.req)
		if err != nil {
			writeTRTError(w, code, err.Error())
			return
		}
		out = ch
	}
	created := time.Now().Unix()
	prefix := "cmpl-"
	if chat {
		prefix = "chatcmpl-"
	}
	respID := prefix + randomHex(32)
	head := func(object string) respHead {
		return respHead{ID: respID, Object: object, Created: created, Model: t.cfg.Sim.Model}
	}
	var (
		sse    *sse
		dec    = tokenizer.NewDecoder(t.tok, true)
		tokens []kv.Token
		text   []byte
		fin    string
		stopR  any
		u      engine.Usage
	)
	if j.stream {
		sse = newSSE(w)
		if chat {
			sse.event(trtChatResp{respHead: head("chat.completion.chunk"), Choices: []trtChatChoice{{Delta: &trtChatDelta{Role: "assistant"}}}})
		}
	}
	emit := func(toks []kv.Token, fr *string) {
		var delta string
		for _, tk := range toks {
			delta += dec.Add(tk)
		}
		if fr != nil {
			delta += dec.Flush()
		}
		text = append(text, delta...)
		if sse == nil || (len(toks) == 0 && fr == nil) {
			return
		}
		if chat {
			sse.event(trtChatResp{respHead: head("chat.completion.chunk"),
				Choices: []trtChatChoice{{Delta: &trtChatDelta{Content: delta}, choiceEnd: ended(fr, stopR)}}})
			return
		}
		c := trtChoice{Text: delta, FinishReason: fr, StopReason: stopR}
		if !j.detok {
			c.Text, c.TokenIDs = "", toks
			if c.TokenIDs == nil {
				c.TokenIDs = []kv.Token{}
			}
		}
		sse.event(trtResp{respHead: head("text_completion"), Choices: []trtChoice{c}})
	}
	// A generation leg starts with the context's first tokens.
	if len(j.first) > 0 {
		tokens = append(tokens, j.first...)
		if out == nil {
			fin = "length"
			t.afterPrefill(ctx, j.pull)
			emit(j.first, &fin)
		} else {
			emit(j.first, nil)
		}
	}
	first := true
	for c := range out {
		if first {
			t.afterPrefill(ctx, j.pull)
			first = false
		}
		if c.Err != nil || c.Finish == kv.FinishError {
			if ctx.Err() != nil {
				return
			}
			msg := "engine error"
			if c.Err != nil {
				msg = c.Err.Error()
			}
			if sse != nil {
				sse.raw(trtErrorJSON(http.StatusInternalServerError, msg))
				sse.done()
			} else {
				writeTRTError(w, http.StatusInternalServerError, msg)
			}
			return
		}
		if c.Finish == kv.FinishCancelled {
			return
		}
		tokens = append(tokens, c.Tokens...)
		var fr *string
		if c.Finish != kv.FinishNone {
			fin = finishName(c.Finish, "cancelled")
			fr = &fin
			if c.Usage != nil {
				u = *c.Usage
			}
			stopR = j.stopReason(c.Finish, tokens)
		}
		emit(c.Tokens, fr)
		if sse != nil && sse.err != nil {
			return
		}
		if fr != nil {
			break
		}
	}
	if fin == "" {
		return
	}
	usage := &usageInfo{PromptTokens: len(j.prompt), CompletionTokens: len(tokens), TotalTokens: len(j.prompt) + len(tokens),
		PromptTokensDetails: &promptDetails{CachedTokens: min(u.CachedTokens, len(j.prompt))}}
	if sse != nil {
		if j.usage {
			if chat {
				sse.event(trtChatResp{respHead: head("chat.completion.chunk"), Choices: []trtChatChoice{}, Usage: usage})
			} else {
				sse.event(trtResp{respHead: head("text_completion"), Choices: []trtChoice{}, Usage: usage})
			}
		}
		sse.done()
		return
	}
	if chat {
		writeJSON(w, http.StatusOK, trtChatResp{respHead: head("chat.completion"),
			Choices: []trtChatChoice{{Message: &trtChatDelta{Role: "assistant", Content: string(text)}, choiceEnd: ended(&fin, stopR)}}, Usage: usage})
		return
	}
	c := trtChoice{Text: string(text), FinishReason: &fin, StopReason: stopR}
	if !j.detok {
		c.Text, c.TokenIDs = "", tokens
	}
	resp := trtResp{respHead: head("text_completion"), Choices: []trtChoice{c}, Usage: usage}
	if ctxOnly {
		c.DisaggregatedParams = t.contextAnswer(j, tokens, fin)
		resp.Choices[0] = c
		resp.PromptTokenIDs = j.prompt
	}
	writeJSON(w, http.StatusOK, resp)
}
