package mockengine

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/hints"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/tokenizer"
)

func (s *SGLang) routes() {
	m := http.NewServeMux()
	m.HandleFunc("POST /generate", s.serveGenerate)
	m.HandleFunc("PUT /generate", s.serveGenerate)
	// The OpenAI surface is the vLLM stand-in's (SGLang serves the same
	// protocol); this stand-in's extra fields are vLLM's there.
	m.Handle("POST /v1/completions", s.v.Handler())
	m.Handle("POST /v1/chat/completions", s.v.Handler())
	m.HandleFunc("GET /v1/models", s.serveModels)
	health := func(w http.ResponseWriter, _ *http.Request) {
		if s.v.closed.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}
	m.HandleFunc("GET /health", health)
	m.HandleFunc("GET /health_generate", health)
	m.HandleFunc("GET /get_model_info", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"model_path": s.cfg.Sim.Model, "tokenizer_path": s.cfg.Sim.Model,
			"is_generation": true, "preferred_sampling_params": nil, "weight_version": "default"})
	})
	m.HandleFunc("GET /get_server_info", s.serveServerInfo)
	m.HandleFunc("GET /get_load", func(w http.ResponseWriter, _ *http.Request) {
		out := []map[string]any{}
		for r := range s.v.eng.DPSize() {
			st := s.v.eng.RankStats(r)
			out = append(out, map[string]any{"dp_rank": r, "num_reqs": st.Running + st.Waiting, "num_waiting_reqs": st.Waiting})
		}
		writeJSON(w, http.StatusOK, out)
	})
	serveMetricsAndHints(m, &sglangCollector{s: s}, func() any { return s.Hints() })
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		sglError(w, http.StatusNotFound, "Not Found")
	})
	s.mux = m
}

// sglError answers in SGLang's ErrorResponse shape.
func sglError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"object": "error", "message": msg, "type": http.StatusText(status), "param": nil, "code": status})
}

func (s *SGLang) serveModels(w http.ResponseWriter, _ *http.Request) {
	name := s.cfg.Sim.Model
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{map[string]any{
		"id": name, "object": "model", "created": s.created, "owned_by": "sglang", "root": name, "parent": nil,
		"max_model_len": s.cfg.MaxModelLen}}})
}

// serveServerInfo answers /get_server_info: SGLang's server_args and
// scheduler info, the fields an operator (and kvmesh's adapter) reads.
func (s *SGLang) serveServerInfo(w http.ResponseWriter, _ *http.Request) {
	sc := s.cfg.Sim
	var kvEvents any
	if e := s.v.cfg.Events; e != nil {
		b, _ := json.Marshal(map[string]any{"publisher": "zmq", "endpoint": e.Endpoint, "replay_endpoint": e.ReplayEndpoint, "topic": e.Topic})
		kvEvents = string(b)
	}
	states := make([]map[string]any, s.v.eng.DPSize())
	for r := range states {
		states[r] = map[string]any{"dp_rank": r}
	}
	if s.inv != nil {
		states[0]["kvcr_inventory"] = s.inv.Descriptor()
	}
	top := s.cfg.Topology
	one := func(n int) int { return max(n, 1) }
	port := DefaultBootstrapPort
	if p := s.BootstrapPort(); p != 0 {
		port = p
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"model_path": sc.Model, "tokenizer_path": sc.Model, "served_model_name": sc.Model,
		"context_length": s.cfg.MaxModelLen, "page_size": sc.BlockSize, "tp_size": one(top.TP), "dp_size": s.v.eng.DPSize(), "pp_size": one(top.PP),
		"enable_dp_attention": top.AttentionDP, "nnodes": one(top.NNodes), "tokenizer_worker_num": one(top.TokenizerWorkers),
		"attn_cp_size": one(top.AttnCP), "enable_unified_cache_external_linker": s.inv != nil,
		"disaggregation_mode": s.cfg.DisaggMode, "disaggregation_bootstrap_port": port,
		"disaggregation_transfer_backend": "mooncake", "incremental_streaming_output": s.cfg.Incremental,
		"kv_events_config": kvEvents, "enable_cache_report": true, "skip_tokenizer_init": false,
		"max_total_num_tokens": sc.Blocks * sc.BlockSize, "max_req_input_len": s.cfg.MaxModelLen - 1,
		"internal_states": states, "version": SGLangVersion,
	})
}

// sglRequest is the part of GenerateReqInput the stand-in reads.
type sglRequest struct {
	RID            json.RawMessage `json:"rid"`
	Text           *string         `json:"text"`
	InputIDs       json.RawMessage `json:"input_ids"`
	SamplingParams *sglSampling    `json:"sampling_params"`
	Stream         bool            `json:"stream"`
	LoRAPath       json.RawMessage `json:"lora_path"`
	CacheSalt      *string         `json:"cache_salt"`
	RoutedDPRank   *int            `json:"routed_dp_rank"`
	DataParallel   *int            `json:"data_parallel_rank"`
	KVHints        json.RawMessage `json:"kv_hints"`
	KVRouterHint   json.RawMessage `json:"kv_router_hint"`
	BootstrapHost  *string         `json:"bootstrap_host"`
	BootstrapPort  *int            `json:"bootstrap_port"`
	BootstrapRoom  *uint64         `json:"bootstrap_room"`
}

type sglSampling struct {
	MaxNewTokens      *int     `json:"max_new_tokens"`
	MinNewTokens      *int     `json:"min_new_tokens"`
	Temperature       *float64 `json:"temperature"`
	TopP              *float64 `json:"top_p"`
	TopK              *int     `json:"top_k"`
	MinP              *float64 `json:"min_p"`
	FrequencyPenalty  *float64 `json:"frequency_penalty"`
	PresencePenalty   *float64 `json:"presence_penalty"`
	RepetitionPenalty *float64 `json:"repetition_penalty"`
	StopTokenIDs      []int64  `json:"stop_token_ids"`
	IgnoreEOS         *bool    `json:"ignore_eos"`
	N                 *int     `json:"n"`
	SamplingSeed      *int64   `json:"sampling_seed"`
}

// sglJob is one parsed /generate request.
type sglJob struct {
	rid    string
	rank   int
	prompt []kv.Token
	salt   string
	stream bool
	req    *engine.Request
	room   *uint64
	boot   string // bootstrap host:port (decode)
}

// parse reads and validates a /generate body as SGLang does (its
// SamplingParams.verify bounds), recording any hint.
func (s *SGLang) parse(r *http.Request) (*sglJob, int, string) {
	var q sglRequest
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 64<<20))
	if err := dec.Decode(&q); err != nil {
		return nil, http.StatusBadRequest, "invalid JSON body: " + err.Error()
	}
	j := &sglJob{stream: q.Stream}
	switch {
	case len(q.RID) == 0 || string(q.RID) == "null":
		j.rid = randomHex(32)
	default:
		if err := json.Unmarshal(q.RID, &j.rid); err != nil {
			return nil, http.StatusBadRequest, "rid must be a string for a single request"
		}
	}
	switch {
	case len(q.InputIDs) > 0 && string(q.InputIDs) != "null":
		ids, ok := idList(q.InputIDs)
		if !ok {
			if err := json.Unmarshal(q.InputIDs, &ids); err != nil {
				return nil, http.StatusBadRequest, "input_ids must be a list of token ids (the stand-in serves single requests)"
			}
		}
		toks, err := s.v.checkIDs(ids)
		if err != nil {
			return nil, http.StatusBadRequest, err.Error()
		}
		j.prompt = toks
	case q.Text != nil:
		j.prompt = s.v.tok.Encode(*q.Text)
	default:
		return nil, http.StatusBadRequest, "Either text, input_ids or input_embeds should be provided."
	}
	if len(j.prompt) == 0 {
		return nil, http.StatusBadRequest, "input_ids cannot be empty."
	}
	if len(q.LoRAPath) > 0 && string(q.LoRAPath) != "null" && string(q.LoRAPath) != `""` {
		return nil, http.StatusBadRequest, "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."
	}
	if q.CacheSalt != nil {
		j.salt = *q.CacheSalt
	}
	sp := q.SamplingParams
	if sp == nil {
		sp = &sglSampling{}
	}
	maxNew := 128
	if sp.MaxNewTokens != nil {
		maxNew = *sp.MaxNewTokens
	}
	minNew := 0
	if sp.MinNewTokens != nil {
		minNew = *sp.MinNewTokens
	}
	temp := 1.0
	if sp.Temperature != nil {
		temp = *sp.Temperature
	}
	topP := 1.0
	if sp.TopP != nil {
		topP = *sp.TopP
	}
	between := func(p *float64, lo, hi float64) bool { return p == nil || (*p >= lo && *p <= hi) }
	switch {
	case math.IsNaN(temp) || math.IsInf(temp, 0) || temp < 0:
		return nil, http.StatusBadRequest, fmt.Sprintf("temperature must be a non-negative finite number, got %v.", temp)
	case !(topP > 0 && topP <= 1):
		return nil, http.StatusBadRequest, fmt.Sprintf("top_p must be in (0, 1], got %v.", topP)
	case !between(sp.MinP, 0, 1):
		return nil, http.StatusBadRequest, fmt.Sprintf("min_p must be in [0, 1], got %v.", *sp.MinP)
	case sp.TopK != nil && *sp.TopK < 1 && *sp.TopK != -1:
		return nil, http.StatusBadRequest, fmt.Sprintf("top_k must be -1 (disable) or at least 1, got %d.", *sp.TopK)
	case !between(sp.FrequencyPenalty, -2, 2):
		return nil, http.StatusBadRequest, fmt.Sprintf("frequency_penalty must be in [-2, 2], got %v.", *sp.FrequencyPenalty)
	case !between(sp.PresencePenalty, -2, 2):
		return nil, http.StatusBadRequest, fmt.Sprintf("presence_penalty must be in [-2, 2], got %v.", *sp.PresencePenalty)
	case sp.RepetitionPenalty != nil && !(*sp.RepetitionPenalty > 0 && *sp.RepetitionPenalty <= 2):
		return nil, http.StatusBadRequest, fmt.Sprintf("repetition_penalty must be in (0, 2] (1.0 = no penalty), got %v.", *sp.RepetitionPenalty)
	case maxNew < 0:
		return nil, http.StatusBadRequest, fmt.Sprintf("max_new_tokens must be at least 0, got %d.", maxNew)
	case minNew < 0 || minNew > maxNew:
		return nil, http.StatusBadRequest, fmt.Sprintf("min_new_tokens must be in [0, max_new_tokens(%d)], got %d.", maxNew, minNew)
	case maxNew == 0:
		return nil, http.StatusBadRequest, "max_new_tokens 0 (prefill only) is not served by the kvmesh mock engine"
	case sp.N != nil && *sp.N != 1:
		return nil, http.StatusBadRequest, "the kvmesh mock engine serves n=1 only"
	}
	if len(j.prompt) >= s.cfg.MaxModelLen {
		return nil, http.StatusBadRequest, fmt.Sprintf("The input (%d tokens) is longer than the model's context length (%d tokens).",
			len(j.prompt), s.cfg.MaxModelLen)
	}
	maxNew = min(maxNew, s.cfg.MaxModelLen-len(j.prompt))

	// Data-parallel rank: the router's choice, else the least loaded.
	rank := q.RoutedDPRank
	if rank == nil {
		rank = q.DataParallel
	}
	if rank != nil {
		if *rank < 0 || *rank >= s.v.eng.DPSize() {
			return nil, http.StatusBadRequest, fmt.Sprintf("routed_dp_rank %d: want 0 to %d", *rank, s.v.eng.DPSize()-1)
		}
		j.rank = *rank
	} else {
		j.rank = s.v.leastLoaded()
	}

	req := &engine.Request{ID: j.rid, Tokens: j.prompt, Sampling: kv.Sampling{MaxTokens: maxNew, MinTokens: minNew, Temperature: temp},
		CacheSalt: j.salt, DPRank: j.rank}
	if topP < 1 {
		req.TopP = topP
	}
	if sp.FrequencyPenalty != nil {
		req.FrequencyPenalty = *sp.FrequencyPenalty
	}
	if sp.PresencePenalty != nil {
		req.PresencePenalty = *sp.PresencePenalty
	}
	req.Seed = seedFor(sp.SamplingSeed, temp)
	var err error
	if req.StopTokens, _, err = s.v.stopTokens(sp.IgnoreEOS != nil && *sp.IgnoreEOS, sp.StopTokenIDs); err != nil {
		return nil, http.StatusBadRequest, err.Error()
	}

	// Hints: the native envelope (malformed is a 400, as SGLang's
	// decode_kv_hints_envelope rejects it) and the older kv_router_hint,
	// which SGLang passes to its cache backend untouched.
	if !isNull(q.KVHints) {
		if ae := s.v.recordHint(j.rid, "kv_hints", q.KVHints); ae != nil {
			return nil, http.StatusBadRequest, ae.Message
		}
		if env, err := hints.Parse(q.KVHints); err == nil {
			if h, ok := env.Hint(); ok {
				req.KVHint = h
			}
		}
	}
	if !isNull(q.KVRouterHint) {
		if h := s.recordRouterHint(j.rid, q.KVRouterHint); h != nil && req.KVHint == nil {
			req.KVHint = h
		}
	}

	// Disaggregation: a prefill computes the prompt and its first token
	// and keeps the KV for the room's decode; a decode takes it.
	fake := q.BootstrapHost != nil && *q.BootstrapHost == FakeBootstrapHost
	switch s.cfg.DisaggMode {
	case DisaggPrefill:
		if q.BootstrapRoom == nil {
			return nil, http.StatusBadRequest, "bootstrap_room is required on a prefill server (--disaggregation-mode prefill)"
		}
		if !fake {
			j.room = q.BootstrapRoom
		}
		req.MaxTokens = 1
		req.MinTokens = 0
	case DisaggDecode:
		if q.BootstrapRoom == nil || q.BootstrapHost == nil || (!fake && q.BootstrapPort == nil) {
			return nil, http.StatusBadRequest, "bootstrap_host, bootstrap_port and bootstrap_room are required on a decode server (--disaggregation-mode decode)"
		}
		if !fake {
			j.room = q.BootstrapRoom
			j.boot = net.JoinHostPort(*q.BootstrapHost, strconv.Itoa(*q.BootstrapPort))
		}
	}
	j.req = req
	return j, 0, ""
}

// recordRouterHint records a kv_router_hint {source_control_endpoint,
// block_hashes}; hashes may be integers (signed, as SGLang's events
// carry them) or hex strings (their first 16 digits), as SGLang's KVCR
// seam reads them. An unreadable one is recorded as ignored, never
// refused: SGLang passes it through untouched.
func (s *SGLang) recordRouterHint(rid string, raw json.RawMessage) *kv.Hint {
	rec := HintRecord{RequestID: rid, Field: "kv_router_hint", Envelope: append(json.RawMessage(nil), raw...)}
	var p struct {
		Source string            `json:"source_control_endpoint"`
		Hashes []json.RawMessage `json:"block_hashes"`
	}
	var h *kv.Hint
	if err := json.Unmarshal(raw, &p); err != nil || p.Source == "" || len(p.Hashes) == 0 {
		rec.Ignored = true
	} else {
		h = &kv.Hint{Endpoint: p.Source}
		for _, x := range p.Hashes {
			v, isInt, ok := routerHash(x)
			if !ok {
				break // stop at the first uninterpretable hash, keeping alignment
			}
			h.Hashes = append(h.Hashes, kv.EngineHash(v))
			rec.BlockHashes = append(rec.BlockHashes, v)
			if isInt {
				rec.SignedHashes = append(rec.SignedHashes, int64(v))
			}
		}
		rec.SourceEndpoint = p.Source
		if len(h.Hashes) == 0 {
			rec.Ignored, h = true, nil
		}
	}
	s.v.hints.add(rec)
	return h
}

// routerHash reads one kv_router_hint hash: a JSON integer (signed or
// unsigned 64-bit; isInt) or a hex string.
func routerHash(raw json.RawMessage) (v uint64, isInt, ok bool) {
	t := strings.TrimSpace(string(raw))
	if strings.HasPrefix(t, `"`) {
		var str string
		if json.Unmarshal(raw, &str) != nil {
			return 0, false, false
		}
		str = strings.TrimPrefix(str, "0x")
		if len(str) > 16 {
			str = str[:16]
		}
		u, err := strconv.ParseUint(str, 16, 64)
		return u, false, err == nil
	}
	if strings.HasPrefix(t, "-") {
		i, err := strconv.ParseInt(t, 10, 64)
		return uint64(i), true, err == nil
	}
	u, err := strconv.ParseUint(t, 10, 64)
	return u, true, err == nil
}

// sglFinish is meta_info.finish_reason.
type sglFinish struct {
	Type       string `json:"type"`
	Matched    any    `json:"matched,omitempty"`
	Length     int    `json:"length,omitempty"`
	Message    string `json:"message,omitempty"`
	StatusCode int    `json:"status_code,omitempty"`
	ErrType    string `json:"err_type,omitempty"`
}

type sglMeta struct {
	ID               string     `json:"id"`
	FinishReason     *sglFinish `json:"finish_reason"`
	PromptTokens     int        `json:"prompt_tokens"`
	CompletionTokens int        `json:"completion_tokens"`
	CachedTokens     int        `json:"cached_tokens"`
	E2ELatency       float64    `json:"e2e_latency"`
}

type sglFrame struct {
	Text      string     `json:"text"`
	OutputIDs []kv.Token `json:"output_ids"`
	MetaInfo  sglMeta    `json:"meta_info"`
}

func (s *SGLang) serveGenerate(w http.ResponseWriter, r *http.Request) {
	if s.v.closed.Load() {
		sglError(w, http.StatusServiceUnavailable, errClosed.Error())
		return
	}
	j, status, msg := s.parse(r)
	if j == nil {
		sglError(w, status, msg)
		return
	}
	ctx := r.Context()
	start := time.Now()
	var out *sse
	if j.stream {
		// The stream opens at once, as SGLang's does: the router learns the
		// server has the request before any token.
		out = newSSE(w)
		out.start()
		if out.f != nil {
			out.f.Flush()
		}
	}
	abort := func(status int, msg string) {
		if out == nil {
			sglError(w, status, msg)
			return
		}
		f := &sglFinish{Type: "abort", Message: msg, StatusCode: status, ErrType: http.StatusText(status)}
		out.event(sglFrame{OutputIDs: []kv.Token{}, MetaInfo: sglMeta{ID: j.rid, FinishReason: f, PromptTokens: len(j.prompt)}})
		out.done()
	}
	var ps *pullState
	if s.cfg.DisaggMode == DisaggDecode && j.room != nil {
		// Ask the prefill where the room's KV is (waiting for it to be
		// computed), then pull it from the rank that holds it.
		lctx, cancel := context.WithTimeout(ctx, s.cfg.BootstrapTimeout+time.Second)
		a, err := LookupRoom(lctx, j.boot, *j.room, s.cfg.BootstrapTimeout)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Warn("kv bootstrap failed; aborting the request", "rid", j.rid, "room", *j.room, "bootstrap", j.boot, "err", err)
			abort(http.StatusInternalServerError, "KV transfer failed: "+err.Error())
			return
		}
		if len(a.IDs) > 0 {
			host, _, _ := net.SplitHostPort(j.boot)
			ps = &pullState{p: decodeParams{engineID: a.EngineID, requestID: RoomLeaseID(*j.room), host: host, port: a.Port, blockIDs: poolIDs(a.IDs)}}
			s.v.pulls.Store(j.rid, ps)
			defer s.v.pulls.Delete(j.rid)
		}
	}
	ch, code, err := s.v.generate(ctx, j.req)
	if err != nil {
		abort(code, err.Error())
		return
	}
	var (
		toks  []kv.Token
		text  []byte
		dec   = tokenizer.NewDecoder(s.v.tok, true)
		first = true
		meta  = sglMeta{ID: j.rid, PromptTokens: len(j.prompt)}
	)
	for c := range ch {
		if first {
			s.v.afterPrefill(ctx, ps)
			first = false
		}
		if c.Finish == kv.FinishCancelled || ctx.Err() != nil {
			s.v.noteFinish(j.rank, "abort")
			return // the client is gone: SGLang aborts the request
		}
		if c.Err != nil || c.Finish == kv.FinishError {
			s.v.noteFinish(j.rank, "error")
			m := "engine error"
			if c.Err != nil {
				m = c.Err.Error()
			}
			abort(http.StatusInternalServerError, m)
			return
		}
		var delta []byte
		for _, t := range c.Tokens {
			delta = append(delta, dec.Add(t)...)
		}
		toks = append(toks, c.Tokens...)
		meta.CompletionTokens = len(toks)
		if c.Finish != kv.FinishNone {
			delta = append(delta, dec.Flush()...)
			f := &sglFinish{Type: "length", Length: len(toks)}
			if c.Finish == kv.FinishStop {
				f = &sglFinish{Type: "stop"}
				if len(toks) > 0 {
					f.Matched = toks[len(toks)-1]
				}
			}
			meta.FinishReason = f
			if c.Usage != nil {
				meta.CachedTokens = c.Usage.CachedTokens
			}
			s.v.noteFinish(j.rank, f.Type)
		}
		text = append(text, delta...)
		if c.Finish != kv.FinishNone && j.room != nil && s.cfg.DisaggMode == DisaggPrefill {
			// Keep the prompt's KV for the room's decode; answer once it
			// has taken it (or the lease ran out), as SGLang's prefill
			// answers after the transfer.
			s.holdForDecode(ctx, j)
			if ctx.Err() != nil {
				return
			}
		}
		if out != nil && (len(c.Tokens) > 0 || c.Finish != kv.FinishNone) {
			fr := sglFrame{Text: string(text), OutputIDs: toks, MetaInfo: meta}
			if s.cfg.Incremental {
				fr.Text, fr.OutputIDs = string(delta), c.Tokens
				if fr.OutputIDs == nil {
					fr.OutputIDs = []kv.Token{}
				}
			}
			fr.MetaInfo.E2ELatency = time.Since(start).Seconds()
			out.event(fr)
			if out.err != nil {
				return // the client is gone; ctx cancels the request
			}
		}
		if c.Finish != kv.FinishNone {
			break
		}
	}
	if meta.FinishReason == nil {
		return
	}
	if out != nil {
		out.done()
		return
	}
	meta.E2ELatency = time.Since(start).Seconds()
	if toks == nil {
		toks = []kv.Token{}
	}
	writeJSON(w, http.StatusOK, sglFrame{Text: string(text), OutputIDs: toks, MetaInfo: meta})
}

// holdForDecode leases a finished prefill's prompt blocks under its room,
// answers the room's bootstrap lookup, and waits until the decode has
// pulled them (its notification ends the lease) or the lease ran out.
func (s *SGLang) holdForDecode(ctx context.Context, j *sglJob) {
	room := *j.room
	_, seqs := kv.NewHasher(s.cfg.Sim.BlockSize, "", j.salt).Blocks(j.prompt)
	id := RoomLeaseID(room)
	ids := s.v.leases[j.rank].Grant(id, kv.Seed("", j.salt), seqs)
	s.rooms.publish(room, RoomAnswer{EngineID: s.v.engID, Port: s.v.sides[j.rank].Port(), IDs: ids})
	defer s.rooms.forget(room)
	if len(ids) == 0 {
		return
	}
	select {
	case <-s.v.leases[j.rank].Done(id):
	case <-ctx.Done():
	}
}

// sglangCollector exports SGLang's metric names per DP rank, read from the
// sim at scrape time.
type sglangCollector struct{ s *SGLang }

var sglSeries = rankTable([]string{"model_name", "engine_type", "tp_rank", "pp_rank", "dp_rank"}, []seriesDef{
	{"sglang:num_running_reqs", "The number of running requests.", figRunning},
	{"sglang:num_queue_reqs", "The number of requests in the waiting queue.", figWaiting},
	{"sglang:token_usage", "The token usage.", figKVUsage},
	{"sglang:num_used_tokens", "The number of used tokens.", figUsedTokens},
	{"sglang:cache_hit_rate", "The prefix cache hit rate.", figHitRate},
	{"sglang:prompt_tokens_total", "Number of prefill tokens processed.", figPromptTokens},
	{"sglang:generation_tokens_total", "Number of generation tokens processed.", figOutputTokens},
	{"sglang:cached_tokens_total", "Number of cached prompt tokens.", figCachedTokens},
})

func (c *sglangCollector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c *sglangCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	engineType := map[string]string{DisaggNull: "unified", DisaggPrefill: "prefill", DisaggDecode: "decode"}[s.cfg.DisaggMode]
	s.v.collectRanks(ch, sglSeries, func(r int) []string {
		return []string{s.cfg.Sim.Model, engineType, "0", "0", strconv.Itoa(r)}
	})
}
