package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/mockengine"
	"github.com/kvmesh/kvmesh/natsbus/natstest"
)

// peerService stands in for an engine's KV peer service (a KVCR linker):
// kvmesh only checks it accepts connections and advertises it.
func peerService(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return "tcp://" + ln.Addr().String()
}

func tokenPrompt(n int, base uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

type completion struct {
	Choices []struct {
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
		Type    string `json:"type"`
	} `json:"error"`
}

func postCompletion(t *testing.T, ctx context.Context, base string, body map[string]any) *http.Response {
	t.Helper()
	resp, err := tryCompletion(ctx, base, body)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func tryCompletion(ctx context.Context, base string, body map[string]any) (*http.Response, error) {
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/completions", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	return http.DefaultClient.Do(req)
}

func completeOnce(t *testing.T, base string, body map[string]any) (int, completion) {
	t.Helper()
	resp := postCompletion(t, context.Background(), base, body)
	defer resp.Body.Close()
	var c completion
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatalf("status %d body %s", resp.StatusCode, raw)
	}
	return resp.StatusCode, c
}

// streamTokens reads an SSE completion stream: chunks with text, and
// whether [DONE] came.
func streamTokens(t *testing.T, r io.Reader, each func(n int)) (chunks int, done bool, errMsg string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			return chunks, true, errMsg
		}
		var c completion
		if json.Unmarshal([]byte(line), &c) == nil {
			if c.Error != nil {
				errMsg = c.Error.Message
			}
			if len(c.Choices) > 0 && c.Choices[0].Text != "" {
				chunks++
				if each != nil {
					each(chunks)
				}
			}
		}
	}
	return chunks, false, errMsg
}

// kvmesh frontend → two `kvmesh worker --engine vllm` → two
// `kvmesh mock-engine vllm`: requests streamed and not, an engine's 4xx
// as the client's 400, KV events caught up through replay into the
// router's index, a hint at the target mock naming the source mock's own
// block hashes, cancellation reaching the engine, and an engine killed
// mid-stream migrated to the other.
func TestVLLMAdapterE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ns := natstest.Start(t)
	// Slow enough that streams last, small context so the engine's own
	// limit is stricter than the fleet's capacity check.
	mocks := []*mockProc{
		startMockVLLM(t, "mock A", "--speedup-ratio", "4", "--max-model-len", "4096"),
		startMockVLLM(t, "mock B", "--speedup-ratio", "4", "--max-model-len", "4096"),
	}
	// Blocks computed before any worker listens: they reach the index
	// through the replay socket.
	early := tokenPrompt(40*16, 1000)
	if st, c := completeOnce(t, mocks[0].url+"/v1", map[string]any{"prompt": early, "max_tokens": 1}); st != 200 {
		t.Fatalf("warm mock A: %d %+v", st, c)
	}
	base, peers := startHintFleet(t, ns.URL(), mocks)
	feMetrics := strings.TrimSuffix(base, "/v1") + "/metrics"

	// The engine's 4xx is the client's 400, with the engine's message.
	st, c := completeOnce(t, base, map[string]any{"model": "mock-model", "prompt": tokenPrompt(5000, 3), "max_tokens": 5})
	if st != 400 || c.Error == nil || !strings.Contains(c.Error.Message, "maximum context length is 4096") {
		t.Fatalf("too long for the engine: %d %+v", st, c.Error)
	}

	// Catch-up through replay: one live batch from mock A (sent to it
	// directly) shows its worker what it missed; the router then predicts
	// the early prompt's 40 blocks cached.
	testutil.WaitFor(t, 10*time.Second, "mock A's early blocks in the router's index", func() bool {
		completeOnce(t, mocks[0].url+"/v1", map[string]any{"prompt": tokenPrompt(16, 90000), "max_tokens": 1})
		before := metricSum(t, feMetrics, "kvmesh_router_predicted_cached_tokens_total")
		completeOnce(t, base, map[string]any{"model": "mock-model", "prompt": early, "max_tokens": 1})
		return metricSum(t, feMetrics, "kvmesh_router_predicted_cached_tokens_total")-before >= 40*16
	})

	// A hint at the other mock names the holder's own block hashes (the
	// mock's, not kvmesh's).
	shared := tokenPrompt(20*16, 50000)
	completeOnce(t, base, map[string]any{"model": "mock-model", "prompt": shared, "max_tokens": 1})
	_, seq := kv.NewHasher(16, "", "").Blocks(shared)
	want := make([]uint64, len(seq))
	for i, s := range seq {
		want[i] = uint64(mockengine.EngineHash(s))
	}
	hint, target, stopStreams := awaitHint(t, base, mocks, shared)
	if hint.Field != "kv_hints" || hint.SourceEndpoint != peers[1-target] || fmt.Sprint(hint.BlockHashes) != fmt.Sprint(want) {
		stopStreams()
		t.Fatalf("hint at mock %d: %+v\nwant source %s hashes %v", target, hint, peers[1-target], want)
	}

	// Cancellation: the held streams end at the engines too.
	stopStreams()
	testutil.WaitFor(t, 10*time.Second, "no request running on the mocks", func() bool {
		return mocks[0].metric(t, "vllm:num_requests_running")+mocks[1].metric(t, "vllm:num_requests_running") == 0
	})

	checkMigrationOnKill(t, base, mocks, "vllm:num_requests_running")
}

// `kvmesh serve --engine vllm` in front of two mocks: the model name and
// block size come from the engines, requests flow, and bad engine flags
// fail at start naming the flag.
func TestServeVLLMEngines(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	a := startMockVLLM(t, "mock A", "--speedup-ratio", "0")
	b := startMockVLLM(t, "mock B", "--speedup-ratio", "0")
	s := startServe(t, "--engine", "vllm", "--engine-url", a.url+","+b.url, "--kv-events", a.events+","+b.events,
		"--kv-events-replay", a.replay+","+b.replay)
	defer s.stop(t)
	checkServed(t, s.base)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--engine", "vllm"}, "--engine vllm needs --engine-url"},
		{[]string{"--engine", "vllm", "--engine-url", "ftp://x"}, "--engine-url (entry 1)"},
		{[]string{"--engine", "vllm", "--engine-url", a.url + "," + b.url, "--kv-events", a.events}, "--kv-events: 1 entries for 2 engines"},
		{[]string{"--engine", "vllm", "--engine-url", a.url, "--hint-form", "loud"}, "--hint-form"},
		{[]string{"--engine", "vllm", "--engine-url", a.url, "--peer-endpoint", "tcp://0.0.0.0:1"}, "--peer-endpoint (entry 1)"},
		{[]string{"--engine-url", a.url}, "need a real engine's --engine ("},
		{[]string{"--engine", "vllm", "--engine-url", a.url, "--engine-timeout", "0s"}, "--engine-timeout 0s: want > 0"},
		{[]string{"--engine", "vllm", "--prefill-engine-url", a.url}, "come together"},
	} {
		expectRefused(t, tc.want, append([]string{"serve", "--listen", "127.0.0.1:0"}, tc.args...)...)
	}
	// A worker whose peer endpoint does not answer never registers.
	ns := natstest.Start(t)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "tcp://" + ln.Addr().String()
	ln.Close()
	expectRefused(t, "--peer-endpoint "+dead+" (rank 0) is not dialable", "worker", "--engine", "vllm", "--engine-url", a.url, "--peer-endpoint", dead, "--nats", ns.URL())
	expectRefused(t, "--block-size 32 but the vLLM engine", "worker", "--engine", "vllm", "--engine-url", a.url, "--block-size", "32", "--nats", ns.URL())
}
