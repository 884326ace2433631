package trtllm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/enginetest"
	"github.com/kvmesh/kvmesh/engine/remote"
	"github.com/kvmesh/kvmesh/kv"
)

// fakeServer answers like trtllm-serve, recording the completion bodies.
type fakeServer struct {
	mu     sync.Mutex
	bodies []map[string]json.RawMessage
	answer func(w http.ResponseWriter, body map[string]json.RawMessage)
	events []string // answers of successive POST /kv_cache_events
}

func (f *fakeServer) start(t *testing.T) string {
	t.Helper()
	m := http.NewServeMux()
	m.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {})
	m.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model","owned_by":"tensorrt_llm"}]}`)
	})
	m.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, `[{"iter":3,"numActiveRequests":2,"numQueuedRequests":1,"kvCacheStats":{"maxNumBlocks":100,"usedNumBlocks":40,"tokensPerBlock":4,"cacheHitRate":0.5}}]`)
	})
	m.HandleFunc("POST /kv_cache_events", func(w http.ResponseWriter, _ *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.events) == 0 {
			io.WriteString(w, "[]")
			return
		}
		io.WriteString(w, f.events[0])
		f.events = f.events[1:]
	})
	m.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		var body map[string]json.RawMessage
		json.NewDecoder(r.Body).Decode(&body)
		f.mu.Lock()
		f.bodies = append(f.bodies, body)
		f.mu.Unlock()
		f.answer(w, body)
	})
	s := httptest.NewServer(m)
	t.Cleanup(s.Close)
	return s.URL
}

func (f *fakeServer) last() map[string]json.RawMessage {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bodies[len(f.bodies)-1]
}

func TestGenerateAndLegs(t *testing.T) {
	f := &fakeServer{}
	ctxParams := `{"request_type":"context_only","first_gen_tokens":[77],"ctx_request_id":9,"encoded_opaque_state":"b3BhcXVl","draft_tokens":null,"disagg_request_id":5,"ctx_dp_rank":0}`
	finish := "length"
	f.answer = func(w http.ResponseWriter, body map[string]json.RawMessage) {
		if string(body["stream"]) == "true" {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, `data: {"choices":[{"index":0,"text":"","token_ids":[77],"finish_reason":null}],"usage":null}`+"\n\n")
			io.WriteString(w, `data: {"choices":[{"index":0,"text":"","token_ids":[78],"finish_reason":"length"}],"usage":null}`+"\n\n")
			io.WriteString(w, `data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11,"prompt_tokens_details":{"cached_tokens":8}}}`+"\n\n")
			io.WriteString(w, "data: [DONE]\n\n")
			return
		}
		fmt.Fprintf(w, `{"choices":[{"index":0,"text":"","token_ids":[77],"finish_reason":%q,"disaggregated_params":%s}],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10},"prompt_token_ids":[1,2,3,4,5,6,7,8,9]}`, finish, ctxParams)
	}
	e, err := New(context.Background(), Config{Config: remote.Config{URL: f.start(t), StatsInterval: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if c := e.Config(); c.Model != "m" || c.BlockSize != 4 || c.Blocks != 100 {
		t.Fatalf("config %+v", c)
	}
	if s := e.Stats(); s.Running != 2 || s.Waiting != 1 || s.UsedBlocks != 40 || s.TotalBlocks != 100 {
		t.Fatalf("stats %+v", s)
	}
	prompt := []kv.Token{1, 2, 3, 4, 5, 6, 7, 8, 9}

	// Aggregated: only TensorRT-LLM's fields, token ids back.
	ch, err := e.Generate(context.Background(), &engine.Request{ID: "r1", Tokens: prompt, Sampling: kv.Sampling{MaxTokens: 2, Seed: 1 << 63, Temperature: 0.5,
		StopTokens: []kv.Token{0}, MinTokens: 1}})
	if err != nil {
		t.Fatal(err)
	}
	toks, last, _ := enginetest.Collect(t, ch)
	if fmt.Sprint(toks) != "[77 78]" || last.Finish != kv.FinishLength || last.Usage.CachedTokens != 8 {
		t.Fatalf("tokens %v last %+v", toks, last)
	}
	b := f.last()
	if string(b["detokenize"]) != "false" || string(b["seed"]) != "9223372036854775808" || string(b["stop_token_ids"]) != "[0]" ||
		string(b["stream_options"]) != `{"include_usage":true}` || b["disaggregated_params"] != nil || b["kv_hints"] != nil {
		t.Fatalf("body %s", b)
	}

	// Context leg: not streamed, context_only with an id; the answer's
	// parameters and prompt are the handoff.
	ch, _ = e.Generate(context.Background(), &engine.Request{ID: "r2", Tokens: prompt, Sampling: kv.Sampling{MaxTokens: 5}, Leg: kv.LegPrefill})
	toks, last, _ = enginetest.Collect(t, ch)
	b = f.last()
	var dp struct {
		RequestType     string `json:"request_type"`
		DisaggRequestID int64  `json:"disagg_request_id"`
	}
	json.Unmarshal(b["disaggregated_params"], &dp)
	if string(b["stream"]) != "false" || b["stream_options"] != nil || dp.RequestType != "context_only" || dp.DisaggRequestID <= 0 {
		t.Fatalf("context body %s", b)
	}
	if fmt.Sprint(toks) != "[77]" || last.Finish != kv.FinishLength || len(last.TransferParams) == 0 {
		t.Fatalf("context answer %v %+v", toks, last)
	}

	// Generation leg: the parameters unchanged but request_type, the
	// context answer's prompt.
	ch, _ = e.Generate(context.Background(), &engine.Request{ID: "r3", Tokens: prompt, Sampling: kv.Sampling{MaxTokens: 5}, Leg: kv.LegDecode,
		TransferParams: last.TransferParams})
	enginetest.Collect(t, ch)
	b = f.last()
	var got, want map[string]any
	json.Unmarshal(b["disaggregated_params"], &got)
	json.Unmarshal([]byte(ctxParams), &want)
	want["request_type"] = "generation_only"
	if fmt.Sprint(got) != fmt.Sprint(want) || string(b["prompt"]) != "[1,2,3,4,5,6,7,8,9]" || string(b["stream"]) != "true" {
		t.Fatalf("generation body %s\nparams %v\nwant %v", b, got, want)
	}

	// A context answer that stopped is final: no handoff.
	finish = "stop"
	ch, _ = e.Generate(context.Background(), &engine.Request{ID: "r4", Tokens: prompt, Sampling: kv.Sampling{MaxTokens: 5}, Leg: kv.LegPrefill})
	if _, last, _ = enginetest.Collect(t, ch); last.Finish != kv.FinishStop || last.TransferParams != nil {
		t.Fatalf("stopped context answer %+v", last)
	}
	// One the engine cancelled is a lost worker (the request migrates).
	finish = "cancelled"
	ch, _ = e.Generate(context.Background(), &engine.Request{ID: "r5", Tokens: prompt, Sampling: kv.Sampling{MaxTokens: 5}, Leg: kv.LegPrefill})
	if _, last, _ = enginetest.Collect(t, ch); !errors.Is(last.Err, engine.ErrUnavailable) {
		t.Fatalf("cancelled context answer %+v", last)
	}

	// What TensorRT-LLM cannot take is refused, not dropped.
	for _, req := range []*engine.Request{
		{Tokens: prompt, Sampling: kv.Sampling{MaxTokens: 1}, LoRA: "a"},
		{Tokens: prompt, Sampling: kv.Sampling{MaxTokens: 1}, CacheSalt: "s"},
	} {
		var rej *remote.RejectedError
		if _, err := e.Generate(context.Background(), req); !errors.As(err, &rej) || rej.Status != 400 {
			t.Fatalf("%+v: %v", req, err)
		}
	}
	if _, err := e.Generate(context.Background(), &engine.Request{Tokens: prompt, Sampling: kv.Sampling{MaxTokens: 1}, Leg: kv.LegDecode,
		TransferParams: []byte(`{"remote_block_ids":[1]}`)}); err == nil || !strings.Contains(err.Error(), "disaggregated_params") {
		t.Fatalf("foreign transfer params: %v", err)
	}
	if err := CheckHintForm("native"); err == nil {
		t.Fatal("native hint form accepted")
	}
}

func TestGenerateErrors(t *testing.T) {
	f := &fakeServer{}
	f.answer = func(w http.ResponseWriter, body map[string]json.RawMessage) {
		if string(body["max_tokens"]) == "3" {
			w.WriteHeader(400)
			io.WriteString(w, `{"object":"error","message":"prompt too long","type":"BadRequestError","param":null,"code":400}`)
			return
		}
		w.WriteHeader(500)
		io.WriteString(w, `{"object":"error","message":"boom","type":"InternalServerError","param":null,"code":500}`)
	}
	e, err := New(context.Background(), Config{Config: remote.Config{URL: f.start(t), StatsInterval: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	_, err = e.Generate(context.Background(), &engine.Request{Tokens: []kv.Token{1}, Sampling: kv.Sampling{MaxTokens: 3}})
	var rej *remote.RejectedError
	if !errors.As(err, &rej) || rej.Message != "prompt too long" {
		t.Fatalf("4xx: %v", err)
	}
	if _, err = e.Generate(context.Background(), &engine.Request{Tokens: []kv.Token{1}, Sampling: kv.Sampling{MaxTokens: 4}}); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("5xx: %v", err)
	}
}

// The ZMQ-shaped parts of the shared configuration have no meaning for a
// server that is one rank and whose events are polled: refused, not
// ignored.
func TestConfigRefusesRanksAndZMQ(t *testing.T) {
	for _, c := range []remote.Config{
		{URL: "http://127.0.0.1:1", DPSize: 2},
		{URL: "http://127.0.0.1:1", Events: "http://127.0.0.1:1", ReplayEvents: "tcp://127.0.0.1:2"},
		{URL: "http://127.0.0.1:1", Topic: "kv"},
		{URL: "127.0.0.1:1"},
	} {
		if _, err := New(context.Background(), Config{Config: c}); err == nil || !strings.HasPrefix(err.Error(), "trtllm ") {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

// Polled events reach the sink; an engine that never returns one, after
// enough generations, is said to have its event buffer off.
func TestPolledEvents(t *testing.T) {
	f := &fakeServer{events: []string{
		`[{"event_id":0,"data":{"type":"created","num_blocks_per_cache_level":[100]},"window_size":64},
		  {"event_id":1,"data":{"type":"stored","parent_hash":null,"blocks":[` + block(5, 0, 4, 0) + `]},"window_size":64}]`,
		`[{"event_id":3,"data":{"type":"removed","block_hashes":[5]},"window_size":64}]`,
	}}
	f.answer = func(w http.ResponseWriter, _ map[string]json.RawMessage) {
		io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"text\":\"\",\"token_ids\":[1],\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n")
	}
	url := f.start(t)
	e, err := New(context.Background(), Config{Config: remote.Config{URL: url, Events: url, StatsInterval: time.Hour}, PollInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var mu sync.Mutex
	var got []kv.Event
	e.SetEventSink(func(b []kv.Event) { mu.Lock(); got = append(got, b...); mu.Unlock() })
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("events %+v", got)
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	if got[0].Kind != kv.EventStored || got[1].Kind != kv.EventCleared || got[2].Kind != kv.EventRemoved {
		t.Fatalf("events %+v", got)
	}
	mu.Unlock()
	if s := e.EventStats(); s.Gaps != 1 || s.Lost != 1 || s.Cleared != 1 || s.Events != 3 {
		t.Fatalf("stats %+v", s)
	}

	// No events at all: the adapter says event_buffer_max_size is off.
	f2 := &fakeServer{answer: f.answer}
	url2 := f2.start(t)
	e2, err := New(context.Background(), Config{Config: remote.Config{URL: url2, Events: url2, StatsInterval: time.Hour}, PollInterval: 5 * time.Millisecond, EventsHintAfter: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Close()
	e2.SetEventSink(func([]kv.Event) {})
	for range 2 {
		ch, err := e2.Generate(context.Background(), &engine.Request{Tokens: []kv.Token{1}, Sampling: kv.Sampling{MaxTokens: 1}})
		if err != nil {
			t.Fatal(err)
		}
		enginetest.Collect(t, ch)
	}
	for deadline := time.Now().Add(5 * time.Second); !e2.EventsMissing(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no event_buffer_max_size diagnosis")
		}
	}
}
