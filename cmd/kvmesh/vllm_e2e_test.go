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
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/mockengine"
	"github.com/kvmesh/kvmesh/natsbus"
)

var (
	mockLine   = regexp.MustCompile(`^kvmesh mock-engine vllm: serving \S+ on (http://\S+) `)
	mockEvents = regexp.MustCompile(`^  rank 0: kv events (\S+), replay (\S+)`)
)

// mockProc is a running `kvmesh mock-engine vllm`.
type mockProc struct {
	*testutil.Proc
	url, events, replay string
}

func startMockVLLM(t *testing.T, name string, args ...string) *mockProc {
	t.Helper()
	p := startProc(t, name, append([]string{"mock-engine", "vllm", "mock-model", "--port", "0", "--block-size", "16", "--blocks", "1024",
		"--kv-events-endpoint", "tcp://127.0.0.1:0", "--kv-events-replay-endpoint", "tcp://127.0.0.1:0", "--log-level", "warn"}, args...)...)
	m := p.Expect(mockLine, 20*time.Second)
	e := p.Expect(mockEvents, 5*time.Second)
	return &mockProc{Proc: p, url: m[1], events: e[1], replay: e[2]}
}

func (m *mockProc) metric(t *testing.T, name string) float64 {
	t.Helper()
	var sum float64
	for k, v := range testutil.Scrape(t, m.url+"/metrics") {
		if k == name || strings.HasPrefix(k, name+"{") {
			sum += v
		}
	}
	return sum
}

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
	ns, err := natsbus.StartEmbedded(natsbus.EmbeddedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
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
	peers := []string{peerService(t), peerService(t)}
	for i, m := range mocks {
		w := startProc(t, fmt.Sprintf("worker %c", 'A'+i), "worker", "--engine", "vllm", "--engine-url", m.url, "--kv-events", m.events,
			"--kv-events-replay", m.replay, "--peer-endpoint", peers[i], "--model", "mock-model", "--nats", ns.URL(), "--log-level", "warn",
			"--engine-timeout", "20s")
		if got := w.Expect(workerLine, 30*time.Second); got[3] != "mock-model" {
			t.Fatalf("worker ready line %v", got)
		}
	}
	fe := startProc(t, "frontend", "frontend", "--nats", ns.URL(), "--model", "mock-model", "--listen", "127.0.0.1:0", "--log-level", "warn")
	base := fe.Expect(frontendLine, 30*time.Second)[1]
	ws := watchWorkers(t, ns.URL(), "mock-model", 2)
	for _, in := range ws.watcher.Instances() {
		if in.AcceptsHints == nil || !*in.AcceptsHints || len(in.ControlEndpoints) != 1 || in.BlockSize != 16 {
			t.Fatalf("registration %+v", in)
		}
	}
	testutil.WaitFor(t, 20*time.Second, "the frontend ready", func() bool {
		resp, err := http.Get(strings.TrimSuffix(base, "/v1") + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	feMetric := func(name string) float64 {
		var sum float64
		for k, v := range testutil.Scrape(t, strings.TrimSuffix(base, "/v1")+"/metrics") {
			if k == name || strings.HasPrefix(k, name+"{") {
				sum += v
			}
		}
		return sum
	}

	// Not streamed, then streamed.
	st, c := completeOnce(t, base, map[string]any{"model": "mock-model", "prompt": tokenPrompt(50, 7), "max_tokens": 5})
	if st != 200 || c.Usage.PromptTokens != 50 || c.Usage.CompletionTokens != 5 || c.Choices[0].FinishReason != "length" {
		t.Fatalf("completion %d %+v", st, c)
	}
	resp := postCompletion(t, context.Background(), base, map[string]any{"model": "mock-model", "prompt": tokenPrompt(50, 7),
		"max_tokens": 8, "stream": true})
	chunks, done, msg := streamTokens(t, resp.Body, nil)
	resp.Body.Close()
	if !done || chunks == 0 || msg != "" {
		t.Fatalf("stream: chunks %d done %v error %q", chunks, done, msg)
	}

	// The engine's 4xx is the client's 400, with the engine's message.
	st, c = completeOnce(t, base, map[string]any{"model": "mock-model", "prompt": tokenPrompt(5000, 3), "max_tokens": 5})
	if st != 400 || c.Error == nil || !strings.Contains(c.Error.Message, "maximum context length is 4096") {
		t.Fatalf("too long for the engine: %d %+v", st, c.Error)
	}

	// Catch-up through replay: one live batch from mock A (sent to it
	// directly) shows its worker what it missed; the router then predicts
	// the early prompt's 40 blocks cached.
	testutil.WaitFor(t, 10*time.Second, "mock A's early blocks in the router's index", func() bool {
		completeOnce(t, mocks[0].url+"/v1", map[string]any{"prompt": tokenPrompt(16, 90000), "max_tokens": 1})
		before := feMetric("kvmesh_router_predicted_cached_tokens_total")
		completeOnce(t, base, map[string]any{"model": "mock-model", "prompt": early, "max_tokens": 1})
		return feMetric("kvmesh_router_predicted_cached_tokens_total")-before >= 40*16
	})

	// A hint: load the holder of a prefix with long streams of prompts
	// that share it until the router sends one to the other mock, with a
	// hint naming the holder's own block hashes (the mock's, not kvmesh's).
	shared := tokenPrompt(20*16, 50000)
	completeOnce(t, base, map[string]any{"model": "mock-model", "prompt": shared, "max_tokens": 1})
	_, seq := kv.NewHasher(16, "", "").Blocks(shared)
	want := make([]uint64, len(seq))
	for i, s := range seq {
		want[i] = uint64(mockengine.EngineHash(s))
	}
	hctx, stopStreams := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var hint *mockengine.HintRecord
	var target int
	for i := 0; hint == nil && i < 40; i++ {
		p := append(append([]uint32(nil), shared...), tokenPrompt(16, uint32(60000+16*i))...)
		wg.Go(func() {
			resp, err := tryCompletion(hctx, base, map[string]any{"model": "mock-model", "prompt": p, "max_tokens": 3000, "stream": true,
				"ignore_eos": true})
			if err != nil {
				return // cancelled below
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
		deadline := time.Now().Add(300 * time.Millisecond)
		for hint == nil && time.Now().Before(deadline) {
			for mi, m := range mocks {
				var hs struct{ Hints []mockengine.HintRecord }
				r, err := http.Get(m.url + "/debug/kv_hints")
				if err != nil {
					t.Fatal(err)
				}
				json.NewDecoder(r.Body).Decode(&hs)
				r.Body.Close()
				if len(hs.Hints) > 0 {
					hint, target = &hs.Hints[0], mi
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if hint == nil {
		stopStreams()
		wg.Wait()
		t.Fatal("no hint reached a mock")
	}
	if hint.Field != "kv_hints" || hint.SourceEndpoint != peers[1-target] || fmt.Sprint(hint.BlockHashes) != fmt.Sprint(want) {
		t.Fatalf("hint at mock %d: %+v\nwant source %s hashes %v", target, hint, peers[1-target], want)
	}

	// Cancellation: the held streams end at the engines too.
	stopStreams()
	wg.Wait()
	testutil.WaitFor(t, 10*time.Second, "no request running on the mocks", func() bool {
		return mocks[0].metric(t, "vllm:num_requests_running")+mocks[1].metric(t, "vllm:num_requests_running") == 0
	})

	// An engine killed mid-stream: the stream migrates and completes.
	resp = postCompletion(t, context.Background(), base, map[string]any{"model": "mock-model", "prompt": tokenPrompt(64, 777),
		"max_tokens": 200, "stream": true, "ignore_eos": true})
	defer resp.Body.Close()
	var killed bool
	chunks, done, msg = streamTokens(t, resp.Body, func(n int) {
		if n != 5 || killed {
			return
		}
		for _, m := range mocks {
			if m.metric(t, "vllm:num_requests_running") > 0 {
				m.Signal(syscall.SIGKILL)
				killed = true
			}
		}
	})
	if !killed || !done || msg != "" || chunks < 100 {
		t.Fatalf("migration: killed %v, chunks %d, done %v, error %q", killed, chunks, done, msg)
	}
	if n := feMetric("kvmesh_frontend_migrations_total"); n < 1 {
		t.Fatalf("migrations %v", n)
	}
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
	st, c := completeOnce(t, s.base, map[string]any{"model": "mock-model", "prompt": tokenPrompt(40, 5), "max_tokens": 4})
	if st != 200 || c.Usage.CompletionTokens != 4 {
		t.Fatalf("serve --engine vllm: %d %+v", st, c)
	}
	// Chat: the frontend's template writes special tokens (ChatML
	// markers) the engine must take as ids.
	client := newClient(s.base)
	chat, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "mock-model",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello there")}, MaxTokens: openai.Int(6)})
	if err != nil || chat.Usage.CompletionTokens == 0 {
		t.Fatalf("chat through serve --engine vllm: %v %+v", err, chat)
	}
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
		p := startProc(t, "bad serve", append([]string{"serve", "--listen", "127.0.0.1:0"}, tc.args...)...)
		select {
		case <-p.Done():
		case <-time.After(20 * time.Second):
			t.Fatalf("%v: serve kept running", tc.args)
		}
		if p.Err() == nil || !strings.Contains(p.Stderr(), tc.want) {
			t.Errorf("%v: exit %v, stderr %q, want %q", tc.args, p.Err(), p.Stderr(), tc.want)
		}
	}
	// A worker whose peer endpoint does not answer never registers.
	ns, err := natsbus.StartEmbedded(natsbus.EmbeddedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "tcp://" + ln.Addr().String()
	ln.Close()
	p := startProc(t, "worker", "worker", "--engine", "vllm", "--engine-url", a.url, "--peer-endpoint", dead, "--nats", ns.URL())
	<-p.Done()
	if !strings.Contains(p.Stderr(), "--peer-endpoint "+dead+" (rank 0) is not dialable") {
		t.Fatalf("dead peer endpoint: %s", p.Stderr())
	}
	p = startProc(t, "worker", "worker", "--engine", "vllm", "--engine-url", a.url, "--block-size", "32", "--nats", ns.URL())
	<-p.Done()
	if !strings.Contains(p.Stderr(), "--block-size 32 but the vLLM engine") {
		t.Fatalf("pinned block size: %s", p.Stderr())
	}
}
