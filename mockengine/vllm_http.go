package mockengine

import (
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/tokenizer"
)

// serveHealthAndVersion answers GET /health (503 once closed) and GET
// /version.
func serveHealthAndVersion(m *http.ServeMux, closed *atomic.Bool, version string) {
	m.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		if closed.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	m.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": version})
	})
}

// serveMetricsAndHints serves c's series at GET /metrics and the hints
// the engine saw (hints) at GET /debug/kv_hints.
func serveMetricsAndHints(m *http.ServeMux, c prometheus.Collector, hints func() any) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	m.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	m.HandleFunc("GET /debug/kv_hints", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"hints": hints()})
	})
}

func (v *VLLM) routes() {
	m := http.NewServeMux()
	m.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { v.serveGenerate(w, r, false) })
	m.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { v.serveGenerate(w, r, true) })
	m.HandleFunc("GET /v1/models", v.serveModels)
	serveHealthAndVersion(m, &v.closed, VLLMVersion)
	m.HandleFunc("GET /load", func(w http.ResponseWriter, _ *http.Request) {
		s := v.eng.Stats()
		writeJSON(w, http.StatusOK, map[string]int{"server_load": s.Running + s.Waiting})
	})
	serveMetricsAndHints(m, &vllmCollector{v: v}, func() any { return v.Hints() })
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, &APIError{Status: http.StatusNotFound, Message: "Not Found"})
	})
	v.mux = m
}

func (v *VLLM) serveModels(w http.ResponseWriter, _ *http.Request) {
	name := v.cfg.Sim.Model
	card := func(id, root string, parent any) map[string]any {
		return map[string]any{"id": id, "object": "model", "created": v.created, "owned_by": "vllm", "root": root,
			"parent": parent, "max_model_len": v.maxLen,
			"permission": []any{map[string]any{"id": "modelperm-" + randomHex(32), "object": "model_permission",
				"created": v.created, "allow_create_engine": false, "allow_sampling": true, "allow_logprobs": true,
				"allow_search_indices": false, "allow_view": true, "allow_fine_tuning": false, "organization": "*",
				"group": nil, "is_blocking": false}},
		}
	}
	data := []any{card(name, name, nil)}
	// vLLM lists each --lora-modules adapter with its base as parent.
	for _, l := range v.cfg.LoRAs {
		data = append(data, card(l, l, name))
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

// Response shapes, field for field as vLLM's pydantic models serialise:
// streamed chunks keep the fields vLLM sets explicitly (null included),
// the final usage chunk drops nulls, whole responses keep every field.

type streamUsage struct {
	PromptTokens        int            `json:"prompt_tokens"`
	TotalTokens         int            `json:"total_tokens"`
	CompletionTokens    int            `json:"completion_tokens"`
	PromptTokensDetails *promptDetails `json:"prompt_tokens_details,omitempty"`
}

// respTail closes a whole (not streamed) response.
type respTail struct {
	ServiceTier       any       `json:"service_tier"`
	SystemFingerprint any       `json:"system_fingerprint"`
	Usage             usageInfo `json:"usage"`
}

type cmplStreamChoice struct {
	Index int    `json:"index"`
	Text  string `json:"text"`
	choiceEnd
	PromptTokenIDs []kv.Token `json:"prompt_token_ids"`
	TokenIDs       []kv.Token `json:"token_ids"`
}

type cmplStreamResp struct {
	respHead
	Choices []cmplStreamChoice `json:"choices"`
}

type usageChunk struct {
	respHead
	Choices []struct{}  `json:"choices"`
	Usage   streamUsage `json:"usage"`
}

type cmplChoice struct {
	Index int    `json:"index"`
	Text  string `json:"text"`
	choiceEnd
	TokenIDs       []kv.Token `json:"token_ids"`
	PromptLogprobs any        `json:"prompt_logprobs"`
	PromptTokenIDs []kv.Token `json:"prompt_token_ids"`
}

type cmplResp struct {
	respHead
	Choices []cmplChoice `json:"choices"`
	respTail
	KVTransferParams *prefillParams `json:"kv_transfer_params"`
}

type chatMsgOut struct {
	Role             string `json:"role"`
	Content          string `json:"content"`
	ReasoningContent any    `json:"reasoning_content"`
	ToolCalls        []any  `json:"tool_calls"`
}

type chatChoice struct {
	Index   int        `json:"index"`
	Message chatMsgOut `json:"message"`
	choiceEnd
	TokenIDs []kv.Token `json:"token_ids"`
}

type chatResp struct {
	respHead
	Choices []chatChoice `json:"choices"`
	respTail
	PromptLogprobs   any            `json:"prompt_logprobs"`
	PromptTokenIDs   []kv.Token     `json:"prompt_token_ids"`
	KVTransferParams *prefillParams `json:"kv_transfer_params"`
}

type chatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type chatStreamChoice struct {
	Index        int        `json:"index"`
	Delta        chatDelta  `json:"delta"`
	Logprobs     any        `json:"logprobs"`
	FinishReason *string    `json:"finish_reason"`
	StopReason   any        `json:"stop_reason,omitempty"`
	TokenIDs     []kv.Token `json:"token_ids,omitempty"`
}

type chatStreamResp struct {
	respHead
	Choices        []chatStreamChoice `json:"choices"`
	PromptTokenIDs []kv.Token         `json:"prompt_token_ids,omitempty"`
}

// result is what a request ends with.
type result struct {
	tokens     []kv.Token
	finish     string
	stopReason any
	usage      engine.Usage
	params     *prefillParams
}

func (v *VLLM) serveGenerate(w http.ResponseWriter, r *http.Request, chat bool) {
	if v.closed.Load() {
		WriteError(w, &APIError{Status: http.StatusServiceUnavailable, Message: "The engine is shut down."})
		return
	}
	j, ae := v.parse(r, chat)
	if ae != nil {
		WriteError(w, ae)
		return
	}
	if id := r.Header.Get("X-Request-Id"); id != "" {
		w.Header().Set("X-Request-Id", id)
	}
	var ps *pullState
	if j.decode != nil {
		ps = &pullState{p: *j.decode}
		v.pulls.Store(j.internalID, ps)
		defer v.pulls.Delete(j.internalID)
	}
	// A client that hangs up cancels ctx, and the sim aborts the request.
	ctx := r.Context()
	ch, code, err := v.generate(ctx, j.req)
	if err != nil {
		WriteError(w, &APIError{Status: code, Message: err.Error()})
		return
	}
	created := time.Now().Unix()
	head := func(object string) respHead {
		return respHead{ID: j.respID, Object: object, Created: created, Model: j.model}
	}
	var (
		res   result
		sse   *sse
		dec   = tokenizer.NewDecoder(v.tok, true)
		text  []byte
		first = true
	)
	if j.stream {
		sse = newSSE(w)
		if chat {
			role := chatStreamResp{respHead: head("chat.completion.chunk"),
				Choices: []chatStreamChoice{{Delta: chatDelta{Role: "assistant", Content: new(string)}}}}
			if j.tokenIDs {
				role.PromptTokenIDs = j.prompt
			}
			sse.event(role)
		}
	}
	for c := range ch {
		if first {
			v.afterPrefill(ctx, ps)
		}
		if c.Err != nil || c.Finish == kv.FinishError {
			v.noteFinish(j.rank, "error")
			if ctx.Err() != nil {
				return
			}
			msg := "engine error"
			if c.Err != nil {
				msg = c.Err.Error()
			}
			ae := &APIError{Status: http.StatusInternalServerError, Message: msg}
			if sse != nil {
				sse.raw(errorJSON(ae))
				sse.done()
			} else {
				WriteError(w, ae)
			}
			return
		}
		if c.Finish == kv.FinishCancelled {
			v.noteFinish(j.rank, "abort")
			return // the client is gone
		}
		var delta string
		for _, t := range c.Tokens {
			delta += dec.Add(t)
		}
		res.tokens = append(res.tokens, c.Tokens...)
		var fr *string
		if c.Finish != kv.FinishNone {
			delta += dec.Flush()
			res.finish = finishName(c.Finish, "abort")
			fr = &res.finish
			if c.Usage != nil {
				res.usage = *c.Usage
			}
			res.stopReason = j.stopReason(c.Finish, res.tokens)
			v.noteFinish(j.rank, res.finish)
			// vLLM's connector answers a prefill that ended by length or
			// stop; any other end frees its blocks at once.
			if j.prefill && v.cfg.KVTransfer != nil && (c.Finish == kv.FinishLength || c.Finish == kv.FinishStop) {
				res.params = v.grant(j)
			}
		}
		text = append(text, delta...)
		if sse != nil && (len(c.Tokens) > 0 || fr != nil) {
			toks := c.Tokens
			if toks == nil {
				toks = []kv.Token{}
			}
			if chat {
				ch := chatStreamChoice{Delta: chatDelta{Content: &delta}, FinishReason: fr, StopReason: res.stopReason}
				if j.tokenIDs {
					ch.TokenIDs = toks
				}
				sse.event(chatStreamResp{respHead: head("chat.completion.chunk"), Choices: []chatStreamChoice{ch}})
			} else {
				ch := cmplStreamChoice{Text: delta, choiceEnd: ended(fr, res.stopReason)}
				if j.tokenIDs {
					ch.TokenIDs = toks
					if first {
						ch.PromptTokenIDs = j.prompt
					}
				}
				sse.event(cmplStreamResp{respHead: head("text_completion"), Choices: []cmplStreamChoice{ch}})
			}
			if sse.err != nil {
				return // the write failed: the client is gone, ctx cancels the request
			}
		}
		first = false
		if c.Finish != kv.FinishNone {
			break
		}
	}
	if res.finish == "" {
		return // cancelled before any output
	}
	var details *promptDetails
	if v.cfg.EnablePromptTokensDetails {
		details = &promptDetails{CachedTokens: res.usage.CachedTokens}
	}
	u := usageInfo{PromptTokens: len(j.prompt), CompletionTokens: len(res.tokens),
		TotalTokens: len(j.prompt) + len(res.tokens), PromptTokensDetails: details}
	if sse != nil {
		if j.usage {
			obj := "text_completion"
			if chat {
				obj = "chat.completion.chunk"
			}
			sse.event(usageChunk{respHead: head(obj), Choices: []struct{}{},
				Usage: streamUsage(u)})
		}
		sse.done()
		return
	}
	var tokenIDs, promptIDs []kv.Token
	if j.tokenIDs {
		tokenIDs, promptIDs = res.tokens, j.prompt
		if tokenIDs == nil {
			tokenIDs = []kv.Token{}
		}
	}
	fr := res.finish
	if chat {
		writeJSON(w, http.StatusOK, chatResp{respHead: head("chat.completion"),
			Choices: []chatChoice{{Message: chatMsgOut{Role: "assistant", Content: string(text), ToolCalls: []any{}},
				choiceEnd: ended(&fr, res.stopReason), TokenIDs: tokenIDs}},
			respTail: respTail{Usage: u}, PromptTokenIDs: promptIDs, KVTransferParams: res.params})
		return
	}
	writeJSON(w, http.StatusOK, cmplResp{respHead: head("text_completion"),
		Choices: []cmplChoice{{Text: string(text), choiceEnd: ended(&fr, res.stopReason),
			TokenIDs: tokenIDs, PromptTokenIDs: promptIDs}},
		respTail: respTail{Usage: u}, KVTransferParams: res.params})
}

// vllmCollector exports vLLM's metric names, per DP rank (label engine),
// read from the sim at scrape time. vLLM's counters are declared without
// the _total suffix that prometheus_client adds on the wire, as here.
type vllmCollector struct{ v *VLLM }

var (
	vllmLabels = []string{"model_name", "engine"}
	vllmSeries = rankTable(vllmLabels, []seriesDef{
		{"vllm:num_requests_running", "Number of requests in model execution batches.", figRunning},
		{"vllm:num_requests_waiting", "Number of requests waiting to be processed.", figWaiting},
		{"vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", figKVUsage},
		{"vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", figPromptTokens},
		{"vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", figCachedTokens},
		{"vllm:prompt_tokens_total", "Number of prefill tokens processed.", figPromptTokens},
		{"vllm:generation_tokens_total", "Number of generation tokens processed.", figOutputTokens},
		{"vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", figPreemptions},
	})
	descSuccess  = prometheus.NewDesc("vllm:request_success_total", "Count of successfully processed requests.", append(vllmLabels[:2:2], "finished_reason"), nil)
	descCacheCfg = prometheus.NewDesc("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", []string{"block_size", "num_gpu_blocks", "enable_prefix_caching"}, nil)
)

func (c *vllmCollector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c *vllmCollector) Collect(ch chan<- prometheus.Metric) {
	v := c.v
	model := v.cfg.Sim.Model
	v.collectRanks(ch, vllmSeries, func(r int) []string { return []string{model, strconv.Itoa(r)} })
	v.stats.mu.Lock()
	for k, n := range v.stats.finished {
		if k[1] == "error" || k[1] == "abort" {
			continue
		}
		ch <- prometheus.MustNewConstMetric(descSuccess, prometheus.CounterValue, float64(n), model, k[0], k[1])
	}
	v.stats.mu.Unlock()
	sc := v.cfg.Sim
	ch <- prometheus.MustNewConstMetric(descCacheCfg, prometheus.GaugeValue, 1,
		strconv.Itoa(sc.BlockSize), strconv.Itoa(sc.Blocks), "True")
}
