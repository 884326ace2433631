package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/mockengine"
	"github.com/kvmesh/kvmesh/natsbus/natstest"
)

// activeRequests reads a TensorRT-LLM mock's running requests from its
// iteration stats (none queued since the last read: nothing ran).
func activeRequests(t *testing.T, url string) int {
	t.Helper()
	var stats []struct {
		NumActiveRequests int `json:"numActiveRequests"`
	}
	if err := jsonGet(url+"/metrics", &stats); err != nil {
		t.Fatal(err)
	}
	if len(stats) == 0 {
		return 0
	}
	return stats[len(stats)-1].NumActiveRequests
}

func jsonGet(url string, v any) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

type trtDebug struct {
	Records []mockengine.DisaggRecord `json:"records"`
	Leases  mockengine.LeaseStats     `json:"leases"`
	Pulls   mockengine.PullStats      `json:"pulls"`
	KVBM    sim.KVBMStats             `json:"kvbm"`
}

// kvmesh frontend → two `kvmesh worker --engine trtllm` → two
// `kvmesh mock-engine trtllm`: requests streamed and not (openai-go), an
// engine's 4xx as the client's 400, KV events polled into the router's
// index, a gap in them (an event buffer too small for the poll) clearing
// the worker's holdings, and cancellation reaching the engine.
func TestTRTLLMAdapterE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ns := natstest.Start(t)
	// Mock B's event buffer holds two events: bursts overflow it.
	ma := startMockTRTLLM(t, "mock A", "--speedup-ratio", "4", "--max_seq_len", "4096")
	mb := startMockTRTLLM(t, "mock B", "--speedup-ratio", "4", "--max_seq_len", "4096", "--kv-event-buffer-max-size", "2")
	mps := []*mockProc{ma(), mb()}
	mocks := []string{mps[0].url, mps[1].url}
	var wmetrics []string
	for i, m := range mps {
		addr := freeAddr(t)
		m.startWorker(t, fmt.Sprintf("worker %c", 'A'+i), ns.URL(), "--metrics-listen", addr)
		wmetrics = append(wmetrics, "http://"+addr+"/metrics")
	}
	base := startFrontendProc(t, ns.URL())
	checkRegistered(t, watchWorkers(t, ns.URL(), "mock-model", 2), 32, false)
	feMetrics := strings.TrimSuffix(base, "/v1") + "/metrics"

	// openai-go, not streamed and streamed.
	client := newClient(base)
	prompt := openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: toInt64(tokenPrompt(50, 7))}
	c, err := client.Completions.New(context.Background(), openai.CompletionNewParams{Model: "mock-model", Prompt: prompt, MaxTokens: openai.Int(5)})
	if err != nil || c.Usage.PromptTokens != 50 || c.Usage.CompletionTokens != 5 || c.Choices[0].FinishReason != "length" {
		t.Fatalf("completion %v %+v", err, c)
	}
	st := client.Completions.NewStreaming(context.Background(), openai.CompletionNewParams{Model: "mock-model", Prompt: prompt, MaxTokens: openai.Int(8),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}})
	var text string
	var usage openai.CompletionUsage
	for st.Next() {
		ch := st.Current()
		if len(ch.Choices) > 0 {
			text += ch.Choices[0].Text
		}
		if ch.Usage.CompletionTokens > 0 {
			usage = ch.Usage
		}
	}
	if st.Err() != nil || text == "" || usage.CompletionTokens != 8 {
		t.Fatalf("stream: %v %q %+v", st.Err(), text, usage)
	}

	// The engine's 4xx is the client's 400, with the engine's message.
	code, cc := completeOnce(t, base, map[string]any{"model": "mock-model", "prompt": tokenPrompt(5000, 3), "max_tokens": 5})
	if code != 400 || cc.Error == nil || !strings.Contains(cc.Error.Message, "max_seq_len (4096)") {
		t.Fatalf("too long for the engine: %d %+v", code, cc.Error)
	}

	// Polled events reach the index: a repeat is predicted cached.
	long := tokenPrompt(20*32, 40000)
	completeOnce(t, base, map[string]any{"model": "mock-model", "prompt": long, "max_tokens": 1})
	testutil.WaitFor(t, 10*time.Second, "the prompt's 20 blocks in the router's index", func() bool {
		before := metricSum(t, feMetrics, "kvmesh_router_predicted_cached_tokens_total")
		completeOnce(t, base, map[string]any{"model": "mock-model", "prompt": long, "max_tokens": 1})
		return metricSum(t, feMetrics, "kvmesh_router_predicted_cached_tokens_total")-before >= 20*32
	})
	if n := metricSum(t, wmetrics[0], "kvmesh_kv_event_relay_batches_total") + metricSum(t, wmetrics[1], "kvmesh_kv_event_relay_batches_total"); n == 0 {
		t.Fatal("no relayed batches counted")
	}

	// A gap: bursts straight at mock B overflow its two-event buffer
	// between polls; its worker clears its holdings and counts it.
	testutil.WaitFor(t, 20*time.Second, "a gap in mock B's events", func() bool {
		done := make(chan struct{}, 8)
		for i := range 8 {
			go func() {
				completeOnce(t, mocks[1]+"/v1", map[string]any{"model": "mock-model", "prompt": tokenPrompt(64, uint32(100000+1000*i+int(time.Now().UnixNano()%997))), "max_tokens": 1})
				done <- struct{}{}
			}()
		}
		for range 8 {
			<-done
		}
		return metricSum(t, wmetrics[1], "kvmesh_kv_event_relay_gaps_total") > 0
	})
	if n := metricSum(t, wmetrics[1], "kvmesh_kv_event_relay_cleared_total"); n == 0 {
		t.Fatal("a gap cleared nothing")
	}

	// Cancellation: a client that leaves ends the request at the engine.
	ctx, cancel := context.WithCancel(context.Background())
	resp := postCompletion(t, ctx, base, map[string]any{"model": "mock-model", "prompt": tokenPrompt(64, 777), "max_tokens": 3000,
		"stream": true, "ignore_eos": true})
	streamTokens(t, resp.Body, func(n int) {
		if n == 3 {
			cancel()
		}
	})
	resp.Body.Close()
	testutil.WaitFor(t, 10*time.Second, "no request running on the mocks", func() bool {
		return activeRequests(t, mocks[0])+activeRequests(t, mocks[1]) == 0
	})
}

// kvmesh frontend → `kvmesh worker --engine trtllm --role prefill|decode`
// → a context mock and a generation mock: the context answer's
// disaggregated_params reach the generation mock unchanged but for
// request_type, with the context answer's prompt; the generation mock
// pulls the blocks and frees the context's lease; the answer is the
// aggregated one token for token (the first token once).
func TestTRTLLMDisaggregatedE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ns := natstest.Start(t)
	cm := startMockTRTLLM(t, "context mock", "--speedup-ratio", "0", "--cache-transceiver")
	gm := startMockTRTLLM(t, "generation mock", "--speedup-ratio", "0", "--cache-transceiver")
	ctxMock, genMock := cm(), gm()
	ctxMock.startWorker(t, "prefill worker", ns.URL(), "--role", "prefill")
	genMock.startWorker(t, "decode worker", ns.URL(), "--role", "decode")
	base := startFrontendProc(t, ns.URL(), "--disagg-local-prefill-tokens", "0")
	watchWorkers(t, ns.URL(), "mock-model", 2)

	prompt := tokenPrompt(20*32+5, 4000)
	body := map[string]any{"model": "mock-model", "prompt": prompt, "max_tokens": 12, "seed": 11, "temperature": 0}
	var code int
	var c completion
	testutil.WaitFor(t, 20*time.Second, "a P/D answer", func() bool {
		code, c = completeOnce(t, base, body)
		return code == 200
	})
	if c.Usage.CompletionTokens != 12 {
		t.Fatalf("P/D completion %+v", c)
	}
	// The same request aggregated, straight at the generation mock.
	_, agg := completeOnce(t, genMock.url+"/v1", body)
	if c.Choices[0].Text != agg.Choices[0].Text {
		t.Fatalf("P/D answered %q, aggregated %q", c.Choices[0].Text, agg.Choices[0].Text)
	}
	// Streamed too.
	sb := map[string]any{"model": "mock-model", "prompt": prompt, "max_tokens": 12, "seed": 11, "temperature": 0, "stream": true}
	if s := sseText(t, postCompletion(t, context.Background(), base, sb)); s != agg.Choices[0].Text {
		t.Fatalf("P/D streamed %q, aggregated %q", s, agg.Choices[0].Text)
	}

	var cd, gd trtDebug
	if err := jsonGet(ctxMock.url+"/debug/disaggregated_params", &cd); err != nil {
		t.Fatal(err)
	}
	if err := jsonGet(genMock.url+"/debug/disaggregated_params", &gd); err != nil {
		t.Fatal(err)
	}
	if len(cd.Records) < 2 || len(gd.Records) != len(cd.Records) {
		t.Fatalf("context records %d, generation records %d", len(cd.Records), len(gd.Records))
	}
	for i := range cd.Records {
		var sent, got map[string]any
		json.Unmarshal(cd.Records[i].Params, &sent)
		json.Unmarshal(gd.Records[i].Params, &got)
		if sent["encoded_opaque_state"] == nil || got["request_type"] != "generation_only" {
			t.Fatalf("context params %s, generation params %s", cd.Records[i].Params, gd.Records[i].Params)
		}
		sent["request_type"] = "generation_only"
		if fmt.Sprint(sent) != fmt.Sprint(got) || fmt.Sprint(gd.Records[i].Prompt) != fmt.Sprint(cd.Records[i].Prompt) {
			t.Fatalf("handoff %d changed on the way:\nsent %v\ngot  %v", i, sent, got)
		}
	}
	if gd.Pulls.OK+gd.Pulls.LocalHits < 2 || cd.Leases.Consumed < 2 {
		t.Fatalf("pulls %+v, leases %+v", gd.Pulls, cd.Leases)
	}
	if gd.Pulls.Blocks < 20 {
		t.Fatalf("the generation mock pulled %d blocks, want the prompt's 20", gd.Pulls.Blocks)
	}
}

// sseText is the text of a completion stream, chunk after chunk.
func sseText(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for _, line := range strings.Split(string(raw), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var c completion
		if json.Unmarshal([]byte(data), &c) == nil && len(c.Choices) > 0 {
			out.WriteString(c.Choices[0].Text)
		}
	}
	return out.String()
}

// KVBM with TensorRT-LLM disaggregation: the prefill worker emits the
// connector's YAML, the context mock loads it with a small device pool
// and a host tier; a prompt evicted from the device comes back from the
// host: the client sees it cached, and the router credits the host
// holding it learnt from the context mock's events.
func TestTRTLLMKVBMDisaggE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ns := natstest.Start(t)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	ctxAddr := ln.Addr().String()
	ln.Close()
	ctxURL := "http://" + ctxAddr
	yamlPath := filepath.Join(t.TempDir(), "llm_api_options.yaml")
	sock := filepath.Join(t.TempDir(), "kvbm.sock")
	pw := startProc(t, "prefill worker", "worker", "--engine", "trtllm", "--role", "prefill", "--engine-url", ctxURL, "--kv-events", ctxURL,
		"--connector", "kvbm", "--kvbm-host-blocks", "4096", "--connector-config-out", yamlPath, "--kvbm-socket", sock,
		"--nats", ns.URL(), "--log-level", "warn", "--engine-timeout", "30s")
	testutil.WaitFor(t, 10*time.Second, "the connector YAML", func() bool {
		_, err := os.Stat(yamlPath)
		return err == nil
	})
	yml, _ := os.ReadFile(yamlPath)
	for _, want := range []string{"connector_module: kvmesh_kvbm.trtllm", "connector_scheduler_class: KvmeshConnectorScheduler",
		"connector_worker_class: KvmeshConnectorWorker", "event_buffer_max_size:", "cache_transceiver_config:", "KVMESH_KVBM_SOCKET=" + sock, "4096 host blocks"} {
		if !strings.Contains(string(yml), want) {
			t.Fatalf("connector YAML lacks %q:\n%s", want, yml)
		}
	}
	_, port, _ := net.SplitHostPort(ctxAddr)
	p := startProc(t, "context mock", "mock-engine", "trtllm", "mock-model", "--port", port, "--blocks", "64", "--speedup-ratio", "0",
		"--extra_llm_api_options", yamlPath, "--kvbm-host-blocks", "4096", "--log-level", "warn")
	if m := p.Expect(mockLine, 20*time.Second); m[2] != ctxURL {
		t.Fatalf("context mock at %s, want %s", m[2], ctxURL)
	}
	startMockTRTLLM(t, "generation mock", "--speedup-ratio", "0", "--cache-transceiver")().startWorker(t, "decode worker", ns.URL(), "--role", "decode")
	pw.Expect(workerLine, 30*time.Second)
	base := startFrontendProc(t, ns.URL(), "--disagg-local-prefill-tokens", "0")
	watchWorkers(t, ns.URL(), "mock-model", 2)
	feMetrics := strings.TrimSuffix(base, "/v1") + "/metrics"

	first := tokenPrompt(40*32, 1000)
	req := func(p []uint32) completion {
		var c completion
		var code int
		deadline := time.Now().Add(20 * time.Second)
		for {
			code, c = completeOnce(t, base, map[string]any{"model": "mock-model", "prompt": p, "max_tokens": 4, "seed": 3, "temperature": 0})
			if code == 200 {
				return c
			}
			if time.Now().After(deadline) {
				t.Fatalf("no P/D answer: %d %+v", code, c.Error)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	r0 := req(first)
	// Two more prompts of 40 blocks evict the first from 64 device blocks.
	req(tokenPrompt(40*32, 100000))
	req(tokenPrompt(40*32, 140000))
	// Let the context mock's last events (the device evictions, the host
	// stores) reach the router's index: applied events stop changing.
	last := -1.0
	testutil.WaitFor(t, 10*time.Second, "the router's index settled", func() bool {
		time.Sleep(300 * time.Millisecond)
		n := metricSum(t, feMetrics, "kvmesh_event_feed_events_applied_total")
		settled := n == last
		last = n
		return settled
	})
	before := metricSum(t, feMetrics, "kvmesh_router_predicted_cached_tokens_total")
	r1 := req(first)
	if r1.Choices[0].Text != r0.Choices[0].Text {
		t.Fatalf("repeat answered %q, first %q", r1.Choices[0].Text, r0.Choices[0].Text)
	}
	if d := r1.Usage.PromptTokensDetails; d == nil || d.CachedTokens < 39*32 {
		t.Fatalf("the repeat's cached tokens %+v, want ≥ %d (onboarded from host)", d, 39*32)
	}
	if got := metricSum(t, feMetrics, "kvmesh_router_predicted_cached_tokens_total") - before; got < 39*32 {
		t.Fatalf("the router predicted %v cached tokens for the repeat, want ≥ %d (its host holding)", got, 39*32)
	}
	var cd trtDebug
	if err := jsonGet(ctxURL+"/debug/disaggregated_params", &cd); err != nil {
		t.Fatal(err)
	}
	if cd.KVBM.OnboardedHost < 39 || cd.KVBM.OffloadedHost < 120 {
		t.Fatalf("the context mock's block manager %+v: the repeat should come from the host tier", cd.KVBM)
	}
}

// `kvmesh serve --engine trtllm` in front of two mocks, and the flags
// TensorRT-LLM does not take refused at start, naming the flag.
func TestServeTRTLLMEngines(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ma := startMockTRTLLM(t, "mock A", "--speedup-ratio", "0")
	mb := startMockTRTLLM(t, "mock B", "--speedup-ratio", "0")
	a, b := ma().url, mb().url
	s := startServe(t, "--engine", "trtllm", "--engine-url", a+","+b, "--kv-events", a+","+b)
	defer s.stop(t)
	checkServed(t, s.base)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--engine", "trtllm", "--engine-url", a, "--kv-events", "tcp://127.0.0.1:5557"}, "--kv-events (entry 1)"},
		{[]string{"--engine", "trtllm", "--engine-url", a, "--kv-events", a, "--kv-events-replay", "tcp://127.0.0.1:5558"}, "--kv-events-replay (entry 1): --engine trtllm has no replay endpoint"},
		{[]string{"--engine", "trtllm", "--engine-url", a, "--hint-form", "native"}, "--hint-form \"native\": --engine trtllm takes only off"},
		{[]string{"--engine", "trtllm", "--engine-url", a, "--connector", "kvbm", "--kvbm-host-blocks", "8"}, "--connector kvbm with --engine trtllm: a real engine loads its connector itself"},
	} {
		expectRefused(t, tc.want, append([]string{"serve", "--listen", "127.0.0.1:0"}, tc.args...)...)
	}
	// The worker: a decode worker runs no connector; SGLang gets no
	// connector configuration from kvmesh.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--engine", "trtllm", "--engine-url", a, "--role", "decode", "--connector", "kvbm", "--kvbm-host-blocks", "8"}, "a decode worker runs no connector"},
		{[]string{"--engine", "sglang", "--engine-url", a, "--connector", "kvbm", "--kvbm-host-blocks", "8"}, "--connector kvbm with --engine sglang"},
		{[]string{"--engine", "trtllm", "--engine-url", a, "--connector-config-out", "-"}, "--connector-config-out needs --connector"},
	} {
		expectRefused(t, tc.want, append([]string{"worker", "--nats", s.natsURL}, tc.args...)...)
	}
}

// `kvmesh serve --engine trtllm` with the P/D forms: a context and a
// generation mock behind one process.
func TestServeTRTLLMDisagg(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	cm := startMockTRTLLM(t, "context mock", "--speedup-ratio", "0", "--cache-transceiver")
	gm := startMockTRTLLM(t, "generation mock", "--speedup-ratio", "0", "--cache-transceiver")
	ctxURL, genURL := cm().url, gm().url
	s := startServe(t, "--engine", "trtllm", "--prefill-engine-url", ctxURL, "--prefill-kv-events", ctxURL,
		"--decode-engine-url", genURL, "--decode-kv-events", genURL, "--disagg-local-prefill-tokens", "0")
	defer s.stop(t)
	body := map[string]any{"model": "mock-model", "prompt": tokenPrompt(10*32, 9000), "max_tokens": 7, "seed": 2, "temperature": 0}
	st, c := completeOnce(t, s.base, body)
	_, agg := completeOnce(t, genURL+"/v1", body)
	if st != 200 || c.Usage.CompletionTokens != 7 || c.Choices[0].Text != agg.Choices[0].Text {
		t.Fatalf("serve P/D: %d %+v, aggregated %q", st, c, agg.Choices[0].Text)
	}
	var gd trtDebug
	if err := jsonGet(genURL+"/debug/disaggregated_params", &gd); err != nil {
		t.Fatal(err)
	}
	if len(gd.Records) != 1 || gd.Pulls.Blocks < 10 {
		t.Fatalf("generation mock: %+v", gd)
	}
}
