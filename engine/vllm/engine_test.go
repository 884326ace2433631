package vllm

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/enginetest"
	"github.com/kvmesh/kvmesh/engine/remote"
	"github.com/kvmesh/kvmesh/hints"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
)

func TestAttachReadsModelAndCacheConfig(t *testing.T) {
	v, srv := startMock(t, mockOpts{})
	e := newEngine(t, Config{Config: remote.Config{URL: srv.URL + "/"}})
	c := e.Config()
	if c.Model != testModel || c.BlockSize != 16 || c.Blocks != 512 || e.MaxModelLen() != v.MaxModelLen() {
		t.Fatalf("config %+v max_model_len %d", c, e.MaxModelLen())
	}
	ctx := context.Background()
	if _, err := New(ctx, Config{Config: remote.Config{URL: srv.URL, BlockSize: 32}}); err == nil || !strings.Contains(err.Error(), "--block-size 32") {
		t.Fatalf("pinned block size mismatch: %v", err)
	}
	if _, err := New(ctx, Config{Config: remote.Config{URL: srv.URL, Model: "other"}}); err == nil || !strings.Contains(err.Error(), `"other"`) {
		t.Fatalf("unknown model: %v", err)
	}
	// /health gates: a server that is not up yet is waited for, to ctx.
	sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := New(sctx, Config{Config: remote.Config{URL: "http://" + deadAddr(t)}}); err == nil || !strings.Contains(err.Error(), "not healthy") {
		t.Fatalf("dead engine: %v", err)
	}
}

func TestGenerateStreamsTokensAndUsage(t *testing.T) {
	_, srv := startMock(t, mockOpts{})
	e := newEngine(t, Config{Config: remote.Config{URL: srv.URL}})
	req := &engine.Request{ID: "r1", Tokens: enginetest.Prompt(40, 100), Sampling: kv.Sampling{MaxTokens: 12, Temperature: 0}}
	ch, err := e.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	toks, last, chunks := enginetest.Collect(t, ch)
	if len(toks) != 12 || last.Finish != kv.FinishLength || len(chunks) < 1 {
		t.Fatalf("tokens %d finish %q chunks %d", len(toks), last.Finish, len(chunks))
	}
	if u := last.Usage; u == nil || u.PromptTokens != 40 || u.CompletionTokens != 12 {
		t.Fatalf("usage %+v", last.Usage)
	}
	// The same prompt again: its full blocks come from the prefix cache,
	// and the same seed gives the same tokens.
	ch, _ = e.Generate(context.Background(), req)
	toks2, last, _ := enginetest.Collect(t, ch)
	if last.Usage.CachedTokens != 32 || !slices.Equal(toks, toks2) {
		t.Fatalf("cached %d, tokens equal %v", last.Usage.CachedTokens, slices.Equal(toks, toks2))
	}
}

func TestLoadFromMetrics(t *testing.T) {
	_, srv := startMock(t, mockOpts{speed: 1})
	e := newEngine(t, Config{Config: remote.Config{URL: srv.URL}})
	// A generation held open (the caller does not read) is running and
	// holds blocks while the adapter reads /metrics.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := e.Generate(ctx, &engine.Request{Tokens: enginetest.Prompt(64, 7), Sampling: kv.Sampling{MaxTokens: 4000}})
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "load from /metrics", func() bool {
		s := e.RankStats(0)
		return s.TotalBlocks == 512 && s.UsedBlocks > 0 && s.Running == 1 && e.Stats().Running == 1
	})
	cancel()
	for range ch {
	}
}

// recorder is a fake vLLM that records request bodies and answers with
// canned bodies.
type recorder struct {
	mu     sync.Mutex
	bodies []map[string]json.RawMessage
	hdrs   []http.Header
	status int
	answer string
}

func (r *recorder) start(t *testing.T) string {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`{"data":[{"id":"m","max_model_len":4096}]}`))
	})
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, q *http.Request) {
		var b map[string]json.RawMessage
		json.NewDecoder(q.Body).Decode(&b)
		r.mu.Lock()
		r.bodies, r.hdrs = append(r.bodies, b), append(r.hdrs, q.Header.Clone())
		st, ans := r.status, r.answer
		r.mu.Unlock()
		if st != 0 {
			w.WriteHeader(st)
		}
		w.Write([]byte(ans))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

func (r *recorder) last() (map[string]json.RawMessage, http.Header) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bodies[len(r.bodies)-1], r.hdrs[len(r.hdrs)-1]
}

const streamOK = "data: {\"choices\":[{\"index\":0,\"text\":\"a\",\"token_ids\":[5],\"finish_reason\":null}]}\n\n" +
	"data: {\"choices\":[{\"index\":0,\"text\":\"b\",\"token_ids\":[6],\"finish_reason\":\"length\"}]}\n\n" +
	"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n" +
	"data: [DONE]\n\n"

func TestRequestShapeAndHintForms(t *testing.T) {
	r := &recorder{answer: streamOK}
	url := r.start(t)
	hint := &kv.Hint{ID: "sel-1", Endpoint: "tcp://127.0.0.1:9", Hashes: []kv.EngineHash{11, 1 << 63}}
	want := string(hints.FromHint(hint).Marshal())
	for _, tc := range []struct {
		form      remote.HintForm
		hint      *kv.Hint
		native    bool
		bridge    bool
		hasParams bool
	}{
		{remote.HintNative, hint, true, false, false},
		{remote.HintBridge, hint, false, true, true},
		{remote.HintOff, hint, false, false, false},
		{remote.HintNative, nil, false, false, false},
		{remote.HintBridge, nil, false, false, false},
	} {
		e := newEngine(t, Config{Config: remote.Config{URL: url}, HintForm: tc.form})
		ch, err := e.Generate(context.Background(), &engine.Request{ID: "req-7", Tokens: []kv.Token{1, 2, 3}, CacheSalt: "s",
			Sampling: kv.Sampling{MaxTokens: 2, Temperature: 0.5, TopP: 0.9, Seed: 42, StopTokens: []kv.Token{9}}, KVHint: tc.hint})
		if err != nil {
			t.Fatal(err)
		}
		toks, last, _ := enginetest.Collect(t, ch)
		if !slices.Equal(toks, []kv.Token{5, 6}) || last.Finish != kv.FinishLength || last.Usage.PromptTokens != 3 {
			t.Fatalf("%s: tokens %v last %+v", tc.form, toks, last)
		}
		b, h := r.last()
		if h.Get("X-Request-Id") != "req-7" {
			t.Errorf("X-Request-Id %q", h.Get("X-Request-Id"))
		}
		for k, v := range map[string]string{"model": `"m"`, "prompt": `[1,2,3]`, "max_tokens": "2", "stream": "true",
			"return_token_ids": "true", "cache_salt": `"s"`, "seed": "42", "top_p": "0.9", "temperature": "0.5",
			"stop_token_ids": "[9]", "stream_options": `{"include_usage":true}`} {
			if string(b[k]) != v {
				t.Errorf("%s: %s = %s, want %s", tc.form, k, b[k], v)
			}
		}
		_, native := b["kv_hints"]
		_, params := b["kv_transfer_params"]
		if native != tc.native || params != tc.hasParams {
			t.Fatalf("%s hint %v: kv_hints %v kv_transfer_params %v", tc.form, tc.hint != nil, native, params)
		}
		if tc.native && string(b["kv_hints"]) != want {
			t.Fatalf("kv_hints %s, want %s", b["kv_hints"], want)
		}
		if tc.bridge {
			var p map[string]json.RawMessage
			json.Unmarshal(b["kv_transfer_params"], &p)
			if string(p["kv_hint"]) != want || len(p) != 1 {
				t.Fatalf("bridge params %s", b["kv_transfer_params"])
			}
		}
	}
}

func TestPrefillAndDecodeLegShapes(t *testing.T) {
	params := `{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[1,2]],"remote_engine_id":"e","remote_request_id":"x","remote_host":"h","remote_port":5600,"tp_size":1,"remote_blocks_expiry_time":null}`
	r := &recorder{answer: `{"choices":[{"index":0,"text":"a","token_ids":[5],"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":1},"kv_transfer_params":` + params + `}`}
	url := r.start(t)
	hint := &kv.Hint{ID: "sel", Endpoint: "tcp://127.0.0.1:9", Hashes: []kv.EngineHash{11}}
	for _, form := range []remote.HintForm{remote.HintNative, remote.HintBridge} {
		e := newEngine(t, Config{Config: remote.Config{URL: url}, HintForm: form})
		ch, err := e.Generate(context.Background(), &engine.Request{Tokens: []kv.Token{1, 2, 3}, Leg: kv.LegPrefill, KVHint: hint,
			Sampling: kv.Sampling{MaxTokens: 50, MinTokens: 5}})
		if err != nil {
			t.Fatal(err)
		}
		_, last, _ := enginetest.Collect(t, ch)
		if string(last.TransferParams) != params || last.Finish != kv.FinishLength {
			t.Fatalf("prefill answer %+v", last)
		}
		b, _ := r.last()
		if string(b["stream"]) != "false" || string(b["max_tokens"]) != "1" || b["stream_options"] != nil || b["min_tokens"] != nil {
			t.Fatalf("prefill body %v", b)
		}
		var p map[string]json.RawMessage
		json.Unmarshal(b["kv_transfer_params"], &p)
		for k, v := range map[string]string{"do_remote_decode": "true", "do_remote_prefill": "false", "remote_engine_id": "null",
			"remote_block_ids": "null", "remote_host": "null", "remote_port": "null"} {
			if string(p[k]) != v {
				t.Fatalf("%s: prefill params %s = %s", form, k, p[k])
			}
		}
		if _, bridged := p["kv_hint"]; bridged != (form == remote.HintBridge) {
			t.Fatalf("%s: kv_hint in params %v", form, bridged)
		}
		if _, native := b["kv_hints"]; native != (form == remote.HintNative) {
			t.Fatalf("%s: kv_hints %v", form, native)
		}
	}
	// A prefill that stopped is final: no parameters even if sent.
	r.answer = strings.Replace(r.answer, `"length"`, `"stop"`, 1)
	e := newEngine(t, Config{Config: remote.Config{URL: url}})
	ch, _ := e.Generate(context.Background(), &engine.Request{Tokens: []kv.Token{1, 2, 3}, Leg: kv.LegPrefill, Sampling: kv.Sampling{MaxTokens: 50}})
	if _, last, _ := enginetest.Collect(t, ch); last.TransferParams != nil || last.Finish != kv.FinishStop {
		t.Fatalf("stopped prefill %+v", last)
	}
	// Decode: the parameters whole, byte for byte, and never a hint.
	r.answer = streamOK
	ch, err := e.Generate(context.Background(), &engine.Request{Tokens: []kv.Token{1, 2, 3}, Leg: kv.LegDecode, KVHint: hint,
		TransferParams: []byte(params), Sampling: kv.Sampling{MaxTokens: 8, MinTokens: 5, IgnoreEOS: true}})
	if err != nil {
		t.Fatal(err)
	}
	enginetest.Collect(t, ch)
	b, _ := r.last()
	if string(b["min_tokens"]) != "5" || string(b["ignore_eos"]) != "true" {
		t.Fatalf("decode body min_tokens %s ignore_eos %s", b["min_tokens"], b["ignore_eos"])
	}
	if string(b["kv_transfer_params"]) != params || b["kv_hints"] != nil || string(b["stream"]) != "true" {
		t.Fatalf("decode body kv_transfer_params %s kv_hints %s", b["kv_transfer_params"], b["kv_hints"])
	}
	if _, err := e.Generate(context.Background(), &engine.Request{Tokens: []kv.Token{1}, Leg: kv.LegDecode,
		TransferParams: []byte(`[1]`), Sampling: kv.Sampling{MaxTokens: 2}}); err == nil {
		t.Fatal("decode leg with non-object parameters accepted")
	}
}

// vLLM's ExampleConnector answers a prefill with no kv_transfer_params
// (the decode engine finds the KV in shared storage by the prompt): by
// default such an answer is final; with TransferSharedStorage a prefill
// cut at its one token answers SharedStorageParams so a decode leg
// follows, and one that stopped stays final.
func TestSharedStorageTransfer(t *testing.T) {
	answer := func(finish string) string {
		return `{"choices":[{"index":0,"text":"a","token_ids":[5],"finish_reason":"` + finish + `"}],"usage":{"prompt_tokens":3,"completion_tokens":1},"kv_transfer_params":null}`
	}
	r := &recorder{}
	url := r.start(t)
	for _, tc := range []struct {
		transfer Transfer
		finish   string
		want     string
	}{
		{"", "length", ""},
		{TransferParams, "length", ""},
		{TransferSharedStorage, "length", SharedStorageParams},
		{TransferSharedStorage, "stop", ""},
	} {
		r.answer = answer(tc.finish)
		e := newEngine(t, Config{Config: remote.Config{URL: url}, Transfer: tc.transfer})
		ch, err := e.Generate(context.Background(), &engine.Request{Tokens: []kv.Token{1, 2, 3}, Leg: kv.LegPrefill, Sampling: kv.Sampling{MaxTokens: 50}})
		if err != nil {
			t.Fatal(err)
		}
		if _, last, _ := enginetest.Collect(t, ch); string(last.TransferParams) != tc.want {
			t.Fatalf("%q, finish %s: prefill answer's parameters %s, want %q", tc.transfer, tc.finish, last.TransferParams, tc.want)
		}
		// The prefill leg asks for a remote decode whatever the connector.
		b, _ := r.last()
		var p map[string]json.RawMessage
		json.Unmarshal(b["kv_transfer_params"], &p)
		if string(p["do_remote_decode"]) != "true" {
			t.Fatalf("%q: prefill body kv_transfer_params %s", tc.transfer, b["kv_transfer_params"])
		}
	}
	if _, err := Transfer("nixl").WithDefault(); err == nil || err.Error() != `"nixl": want params or shared-storage` {
		t.Fatalf("unknown transfer: %v", err)
	}
}

func TestErrorsClassified(t *testing.T) {
	r := &recorder{status: 400, answer: `{"error":{"message":"This model's maximum context length is 4096 tokens.","type":"BadRequestError","param":null,"code":400}}`}
	url := r.start(t)
	// The test repoints the engine (e.cfg.URL): no load reader runs meanwhile.
	e := newEngine(t, Config{Config: remote.Config{URL: url, StatsInterval: time.Hour}})
	req := &engine.Request{Tokens: []kv.Token{1}, Sampling: kv.Sampling{MaxTokens: 2}}
	_, err := e.Generate(context.Background(), req)
	var rej *remote.RejectedError
	if !errors.As(err, &rej) || rej.Status != 400 || !strings.Contains(err.Error(), "maximum context length") || errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("4xx: %v", err)
	}
	r.status, r.answer = 500, `{"error":{"message":"boom","code":500}}`
	if _, err := e.Generate(context.Background(), req); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("5xx: %v", err)
	}
	// A stream cut short is a lost engine; an error inside a stream too.
	r.status, r.answer = 0, "data: {\"choices\":[{\"token_ids\":[5],\"finish_reason\":null}]}\n\n"
	ch, err := e.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if _, last, _ := enginetest.Collect(t, ch); !errors.Is(last.Err, engine.ErrUnavailable) {
		t.Fatalf("cut stream: %+v", last)
	}
	r.answer = "data: {\"error\":{\"message\":\"engine dead\",\"code\":500}}\n\n"
	ch, _ = e.Generate(context.Background(), req)
	if _, last, _ := enginetest.Collect(t, ch); !errors.Is(last.Err, engine.ErrUnavailable) || !strings.Contains(last.Err.Error(), "engine dead") {
		t.Fatalf("stream error: %+v", last)
	}
	// Refused connection.
	e.cfg.URL = "http://" + deadAddr(t)
	if _, err := e.Generate(context.Background(), req); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("refused: %v", err)
	}
}

func TestCancelClosesTheStream(t *testing.T) {
	v, srv := startMock(t, mockOpts{speed: 1})
	e := newEngine(t, Config{Config: remote.Config{URL: srv.URL}})
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := e.Generate(ctx, &engine.Request{Tokens: enginetest.Prompt(20, 3), Sampling: kv.Sampling{MaxTokens: 3000, Temperature: 0}})
	if err != nil {
		t.Fatal(err)
	}
	<-ch
	cancel()
	for range ch {
	}
	testutil.WaitFor(t, 10*time.Second, "the mock aborts the request", func() bool { return v.Engine().Stats().Running == 0 })
}

func deadAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
