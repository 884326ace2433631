package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/mockengine"
	"github.com/kvmesh/kvmesh/natsbus/natstest"
)

// kvmesh frontend → two `kvmesh worker --engine sglang --hint-form bridge`
// → two `kvmesh mock-engine sglang`: requests streamed and not, an
// engine's 4xx as the client's 400, SGLang's KV events (signed hashes, no
// DP rank) caught up through replay into the router's index, a
// kv_router_hint at the target mock naming the source mock's own signed
// hashes, cancellation reaching the engine, and an engine killed
// mid-stream migrated to the other.
func TestSGLangAdapterE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ns := natstest.Start(t)
	mocks := []*mockProc{
		startMockSGLang(t, "mock A", "--speedup-ratio", "4", "--context-length", "4096"),
		startMockSGLang(t, "mock B", "--speedup-ratio", "4", "--context-length", "4096"),
	}
	// Blocks computed before any worker listens reach the index through
	// the replay socket.
	early := tokenPrompt(40*16, 1000)
	postGenerate(t, mocks[0].url, map[string]any{"input_ids": early, "sampling_params": map[string]any{"max_new_tokens": 1}})
	base, peers := startHintFleet(t, ns.URL(), mocks, "--hint-form", "bridge")
	feMetrics := strings.TrimSuffix(base, "/v1") + "/metrics"

	// The engines' context length (/get_server_info) bounds requests at the
	// frontend: a 400 naming it before any engine sees the prompt. (The
	// engine's own 4xx reaching the client is tested in engine/sglang.)
	st, c := completeOnce(t, base, map[string]any{"model": "mock-model", "prompt": tokenPrompt(5000, 3), "max_tokens": 5})
	if st != 400 || c.Error == nil || !strings.Contains(c.Error.Message, "maximum context length is 4096 tokens") {
		t.Fatalf("too long for the engine: %d %+v", st, c.Error)
	}

	// Catch-up through replay: the router predicts the early prompt's 40
	// blocks cached (SGLang's signed hashes decoded and indexed).
	testutil.WaitFor(t, 10*time.Second, "mock A's early blocks in the router's index", func() bool {
		postGenerate(t, mocks[0].url, map[string]any{"input_ids": tokenPrompt(16, 90000), "sampling_params": map[string]any{"max_new_tokens": 1}})
		before := metricSum(t, feMetrics, "kvmesh_router_predicted_cached_tokens_total")
		completeOnce(t, base, map[string]any{"model": "mock-model", "prompt": early, "max_tokens": 1})
		return metricSum(t, feMetrics, "kvmesh_router_predicted_cached_tokens_total")-before >= 40*16
	})

	// A hint at the other mock is a kv_router_hint naming the holder's own
	// hashes, signed as SGLang publishes them.
	shared := tokenPrompt(20*16, 50000)
	completeOnce(t, base, map[string]any{"model": "mock-model", "prompt": shared, "max_tokens": 1})
	_, seq := kv.NewHasher(16, "", "").Blocks(shared)
	want := make([]int64, len(seq))
	negative := 0
	for i, s := range seq {
		want[i] = int64(mockengine.EngineHash(s))
		if want[i] < 0 {
			negative++
		}
	}
	if negative == 0 {
		t.Fatal("the test prefix has no negative hash; pick another")
	}
	hint, target, stopStreams := awaitHint(t, base, mocks, shared)
	if hint.Field != "kv_router_hint" || hint.SourceEndpoint != peers[1-target] || fmt.Sprint(hint.SignedHashes) != fmt.Sprint(want) {
		stopStreams()
		t.Fatalf("hint at mock %d: %+v\nwant source %s hashes %v", target, hint, peers[1-target], want)
	}

	// Cancellation: the held streams end at the engines too.
	stopStreams()
	testutil.WaitFor(t, 10*time.Second, "no request running on the mocks", func() bool {
		return mocks[0].metric(t, "sglang:num_running_reqs")+mocks[1].metric(t, "sglang:num_running_reqs") == 0
	})

	checkMigrationOnKill(t, base, mocks, "sglang:num_running_reqs")
}

// postGenerate sends SGLang's native /generate straight to a mock.
func postGenerate(t *testing.T, url string, body map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url+"/generate", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/generate: %d %s", resp.StatusCode, raw)
	}
}

// `kvmesh serve --engine sglang` over a prefill and a decode mock: the
// same request reaches both with one bootstrap room; the decode mock
// pulls the prompt's blocks from the prefill mock's bootstrap port; the
// client reads the decode stream, streamed and not. Short prompts too go
// through both servers: an SGLang decode server cannot prefill alone, so
// serve plans no local prefill on it.
func TestServeSGLangDisaggregated(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	pre := startMockSGLang(t, "prefill mock", "--speedup-ratio", "0", "--disaggregation-mode", "prefill")
	dec := startMockSGLang(t, "decode mock", "--speedup-ratio", "0", "--disaggregation-mode", "decode")
	s := startServe(t, "--engine", "sglang", "--prefill-engine-url", pre.url, "--prefill-kv-events", pre.events,
		"--decode-engine-url", dec.url, "--decode-kv-events", dec.events)
	defer s.stop(t)
	var st int
	var c completion
	testutil.WaitFor(t, 20*time.Second, "a P/D answer", func() bool {
		st, c = completeOnce(t, s.base, map[string]any{"model": "mock-model", "prompt": tokenPrompt(20*16+5, 4000), "max_tokens": 12})
		return st == 200
	})
	if c.Usage.CompletionTokens != 12 {
		t.Fatalf("P/D completion %+v", c)
	}
	resp := postCompletion(t, context.Background(), s.base, map[string]any{"model": "mock-model", "prompt": tokenPrompt(10*16+3, 8000),
		"max_tokens": 20, "stream": true, "ignore_eos": true})
	chunks, done, msg := streamTokens(t, resp.Body, nil)
	resp.Body.Close()
	if !done || chunks == 0 || msg != "" {
		t.Fatalf("P/D stream: chunks %d done %v error %q", chunks, done, msg)
	}
	if n := pre.metric(t, "sglang:prompt_tokens_total"); n < 30*16 {
		t.Fatalf("the prefill mock computed %v prompt tokens", n)
	}
	// The decode mock pulled the full pages (the first prompt's 20, the
	// second's 10) rather than computing them.
	if n := dec.metric(t, "sglang:cached_tokens_total"); n < 30*16 {
		t.Fatalf("decode mock cached %v tokens, want the 480 pulled", n)
	}
	if hs := mockHints(t, dec); len(hs) != 0 {
		t.Fatalf("hints on the decode side: %+v", hs)
	}
	// A server attached in the wrong role fails at start, naming the flag
	// and the engine's mode.
	expectRefused(t, "--prefill-engine-url "+dec.url+": sglang engine "+dec.url+" runs --disaggregation-mode decode",
		"serve", "--listen", "127.0.0.1:0", "--engine", "sglang", "--prefill-engine-url", dec.url, "--decode-engine-url", pre.url, "--engine-timeout", "10s")
	expectRefused(t, "--disagg-local-prefill-tokens 512: sglang decode servers cannot prefill alone",
		"serve", "--listen", "127.0.0.1:0", "--engine", "sglang", "--prefill-engine-url", pre.url, "--decode-engine-url", dec.url, "--disagg-local-prefill-tokens", "512")
}
