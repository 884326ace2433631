package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/natsbus/natstest"
)

// freePortPair finds a loopback port p with p+1 free too: a DP-2 engine's
// rank r publishes on port+r, so port 0 cannot name them.
func freePortPair(t *testing.T) int {
	t.Helper()
	for range 50 {
		a, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := a.Addr().(*net.TCPAddr).Port
		b, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+1))
		a.Close()
		if err == nil {
			b.Close()
			return p
		}
	}
	t.Fatal("no two adjacent free ports")
	return 0
}

// startMockVLLMDP2 runs a mock with two DP ranks on fixed event ports.
func startMockVLLMDP2(t *testing.T, name string, args ...string) *mockProc {
	t.Helper()
	ev, rep := freePortPair(t), freePortPair(t)
	for rep == ev || rep == ev+1 || rep+1 == ev {
		rep = freePortPair(t)
	}
	return startMockVLLM(t, name, append([]string{"--speedup-ratio", "0", "--data-parallel-size", "2",
		"--kv-events-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", ev), "--kv-events-replay-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", rep)}, args...)...)
}

// `kvmesh serve --engine vllm --dp-size 2 --block-size 16` over two
// DP-2 mocks with different context lengths: every engine gets both ranks
// (rank 1's KV events on the events port + 1 reach the router, which then
// routes a prompt back to the rank that holds it), the pinned block size
// is checked against the engines', and the frontend refuses a request the
// smallest engine context cannot hold with OpenAI's 400 before any engine
// sees it.
func TestServeVLLMDPBlockSizeAndContext(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	a := startMockVLLMDP2(t, "mock A", "--max-model-len", "400")
	b := startMockVLLMDP2(t, "mock B", "--max-model-len", "300")
	s := startServe(t, "--engine", "vllm", "--dp-size", "2", "--block-size", "16",
		"--engine-url", a.url+","+b.url, "--kv-events", a.events+","+b.events, "--kv-events-replay", a.replay+","+b.replay)
	defer s.stop(t)

	ws := watchWorkers(t, s.natsURL, "mock-model", 2)
	lens := map[int]bool{}
	for _, in := range ws.watcher.Instances() {
		if in.DPSize != 2 || in.BlockSize != 16 {
			t.Fatalf("instance %+v: want dp_size 2, block_size 16", in)
		}
		lens[in.MaxModelLen] = true
	}
	if !lens[400] || !lens[300] {
		t.Fatalf("registered max_model_len %v, want 400 and 300", lens)
	}
	var models struct {
		Data []struct {
			MaxModelLen int `json:"max_model_len"`
		} `json:"data"`
	}
	resp, err := http.Get(s.base + "/models")
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if len(models.Data) != 1 || models.Data[0].MaxModelLen != 300 {
		t.Fatalf("/v1/models %+v: want max_model_len 300, the smallest engine's", models)
	}

	served := a.metric(t, "vllm:request_success_total") + b.metric(t, "vllm:request_success_total")
	for _, tc := range []struct {
		prompt, maxTokens int
		want              []string
	}{
		{290, 20, []string{"maximum context length is 300 tokens", "you requested 310 tokens (290 in the prompt, 20 in the completion)"}},
		{300, 1, []string{"maximum context length is 300 tokens", "your prompt resulted in 300 tokens"}},
		{10, 400, []string{"maximum context length is 300 tokens", "you requested 410 tokens"}},
	} {
		resp := postCompletion(t, t.Context(), s.base, map[string]any{"model": "mock-model", "prompt": tokenPrompt(tc.prompt, 7), "max_tokens": tc.maxTokens})
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !bytes.Contains(body, []byte(`"code":"context_length_exceeded"`)) {
			t.Fatalf("prompt %d + max_tokens %d: %d %s", tc.prompt, tc.maxTokens, resp.StatusCode, body)
		}
		for _, w := range tc.want {
			if !bytes.Contains(body, []byte(w)) {
				t.Errorf("prompt %d + max_tokens %d: %s lacks %q", tc.prompt, tc.maxTokens, body, w)
			}
		}
	}
	// Without max_tokens, the completion gets what room is left.
	if st, c := completeOnce(t, s.base, map[string]any{"model": "mock-model", "prompt": tokenPrompt(296, 7), "ignore_eos": true}); st != 200 || c.Usage.CompletionTokens != 4 {
		t.Fatalf("prompt of 296 without max_tokens: %d %+v, want 4 completion tokens", st, c)
	}
	if n := a.metric(t, "vllm:request_success_total") + b.metric(t, "vllm:request_success_total"); n != served+1 {
		t.Fatalf("engines finished %v requests, want %v: a refused request reached one", n, served+1)
	}

	// A prompt cached on mock A's rank 1 (written there directly) is
	// routed back to it by its KV events on the events port + 1.
	p := tokenPrompt(128, 9000)
	body, _ := json.Marshal(map[string]any{"model": "mock-model", "prompt": p, "max_tokens": 1})
	req, _ := http.NewRequest(http.MethodPost, a.url+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-data-parallel-rank", "1")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("direct request to rank 1: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	// The event reaches the router some time after the answer.
	testutil.WaitFor(t, 10*time.Second, "rank 1's cached prompt served from its cache", func() bool {
		st, c := completeOnce(t, s.base, map[string]any{"model": "mock-model", "prompt": p, "max_tokens": 1})
		return st == 200 && c.Usage.PromptTokensDetails != nil && c.Usage.PromptTokensDetails.CachedTokens >= 112
	})
	var up int
	for k, v := range testutil.Scrape(t, strings.TrimSuffix(s.base, "/v1")+"/metrics") {
		if strings.HasPrefix(k, "kvmesh_fleet_worker_up{") && v == 1 {
			up++
		}
	}
	if up != 4 {
		t.Fatalf("%d worker keys up, want 4 (two engines × two ranks)", up)
	}
	// The workers' own series are on serve's /metrics, one per engine.
	healthy := 0
	for k, v := range testutil.Scrape(t, strings.TrimSuffix(s.base, "/v1")+"/metrics") {
		if strings.HasPrefix(k, "kvmesh_worker_healthy{") && v == 1 {
			healthy++
		}
	}
	if healthy != 2 {
		t.Fatalf("%d healthy workers on serve's /metrics, want 2", healthy)
	}

	// A pinned block size the engines do not use is one clear error.
	expectRefused(t, "--block-size 32 but the vLLM engine", "serve", "--listen", "127.0.0.1:0", "--engine", "vllm", "--engine-url", a.url, "--block-size", "32")
}

// An engine that stops answering (SIGSTOP: the process lives, its sockets
// stay open, nothing answers) takes its worker out of discovery within a
// few health intervals; the stream it was serving migrates to the other
// engine and completes; the transition is counted and logged once; when
// the engine answers again (SIGCONT) the worker registers again.
func TestVLLMEngineHealthE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ns := natstest.Start(t)
	mocks := []*mockProc{
		startMockVLLM(t, "mock A", "--speedup-ratio", "4"),
		startMockVLLM(t, "mock B", "--speedup-ratio", "4"),
	}
	metricsAt := make([]string, len(mocks))
	workers := make([]*testutil.Proc, len(mocks))
	for i, m := range mocks {
		metricsAt[i] = freeAddr(t)
		workers[i] = m.startWorker(t, fmt.Sprintf("worker %c", 'A'+i), ns.URL(), "--log-level", "info", "--engine-health-interval", "200ms",
			"--metrics-listen", metricsAt[i])
	}
	base := startFrontendProc(t, ns.URL())
	ws := watchWorkers(t, ns.URL(), "mock-model", 2)

	resp := postCompletion(t, t.Context(), base, map[string]any{"model": "mock-model", "prompt": tokenPrompt(64, 777),
		"max_tokens": 200, "stream": true, "ignore_eos": true})
	defer resp.Body.Close()
	stopped := -1
	var stoppedAt time.Time
	chunks, done, msg := streamTokens(t, resp.Body, func(n int) {
		if n != 5 || stopped >= 0 {
			return
		}
		for i, m := range mocks {
			if m.metric(t, "vllm:num_requests_running") > 0 {
				m.Signal(syscall.SIGSTOP)
				stopped, stoppedAt = i, time.Now()
				t.Cleanup(func() { m.Signal(syscall.SIGCONT) })
				return
			}
		}
	})
	if stopped < 0 || !done || msg != "" || chunks < 150 {
		t.Fatalf("stream over a stopped engine: stopped %d, chunks %d, done %v, error %q", stopped, chunks, done, msg)
	}
	// Well within the worker's 30 s stall timeout: the health poll did it.
	streamDone := time.Since(stoppedAt)
	if streamDone > 15*time.Second {
		t.Fatalf("the stream took %v to finish after its engine stopped", streamDone)
	}
	testutil.WaitFor(t, 5*time.Second, "the stopped engine's worker out of discovery", func() bool { return len(ws.watcher.Instances()) == 1 })
	t.Logf("engine stopped after 5 chunks: the stream finished on the other engine %v later, %d chunks", streamDone.Round(time.Millisecond), chunks)
	wm := func(name string) float64 { return metricSum(t, "http://"+metricsAt[stopped]+"/metrics", name) }
	if wm("kvmesh_worker_engine_unhealthy_total") != 1 || wm("kvmesh_worker_healthy") != 0 {
		t.Fatalf("worker metrics: unhealthy_total %v, healthy %v", wm("kvmesh_worker_engine_unhealthy_total"), wm("kvmesh_worker_healthy"))
	}
	// The other worker serves meanwhile.
	if st, c := completeOnce(t, base, map[string]any{"model": "mock-model", "prompt": tokenPrompt(20, 5), "max_tokens": 2}); st != 200 {
		t.Fatalf("with one engine stopped: %d %+v", st, c)
	}
	mocks[stopped].Signal(syscall.SIGCONT)
	resumed := time.Now()
	testutil.WaitFor(t, 10*time.Second, "the worker back in discovery", func() bool { return len(ws.watcher.Instances()) == 2 })
	t.Logf("engine resumed: its worker back in discovery after %v", time.Since(resumed).Round(time.Millisecond))
	if wm("kvmesh_worker_healthy") != 1 {
		t.Fatal("worker not healthy after its engine answers again")
	}
	log := workers[stopped].Stderr()
	if n := strings.Count(log, "engine unhealthy: worker leaves discovery"); n != 1 {
		t.Fatalf("%d unhealthy lines in the worker's log, want 1:\n%s", n, log)
	}
	if n := strings.Count(log, "engine healthy again: worker back in discovery"); n != 1 {
		t.Fatalf("%d healthy-again lines in the worker's log, want 1:\n%s", n, log)
	}
}
