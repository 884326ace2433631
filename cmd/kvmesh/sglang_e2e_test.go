package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/mockengine"
	"github.com/kvmesh/kvmesh/natsbus"
)

var (
	sglMockLine   = regexp.MustCompile(`^kvmesh mock-engine sglang: serving \S+ on (http://\S+) `)
	sglMockEvents = regexp.MustCompile(`^  rank 0: kv events (\S+), replay (\S+)`)
)

func startMockSGLang(t *testing.T, name string, args ...string) *mockProc {
	t.Helper()
	p := startProc(t, name, append([]string{"mock-engine", "sglang", "--served-model-name", "mock-model", "--port", "0", "--page-size", "16",
		"--blocks", "1024", "--kv-events-endpoint", "tcp://127.0.0.1:0", "--kv-events-replay-endpoint", "tcp://127.0.0.1:0",
		"--disaggregation-bootstrap-port", "0", "--log-level", "warn"}, args...)...)
	m := p.Expect(sglMockLine, 20*time.Second)
	e := p.Expect(sglMockEvents, 5*time.Second)
	return &mockProc{Proc: p, url: m[1], events: e[1], replay: e[2]}
}

func mockHints(t *testing.T, m *mockProc) []mockengine.HintRecord {
	t.Helper()
	var hs struct{ Hints []mockengine.HintRecord }
	r, err := http.Get(m.url + "/debug/kv_hints")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	json.NewDecoder(r.Body).Decode(&hs)
	return hs.Hints
}

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
	ns, err := natsbus.StartEmbedded(natsbus.EmbeddedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	mocks := []*mockProc{
		startMockSGLang(t, "mock A", "--speedup-ratio", "4", "--context-length", "4096"),
		startMockSGLang(t, "mock B", "--speedup-ratio", "4", "--context-length", "4096"),
	}
	// Blocks computed before any worker listens reach the index through
	// the replay socket.
	early := tokenPrompt(40*16, 1000)
	postGenerate(t, mocks[0].url, map[string]any{"input_ids": early, "sampling_params": map[string]any{"max_new_tokens": 1}})
	peers := []string{peerService(t), peerService(t)}
	for i, m := range mocks {
		w := startProc(t, fmt.Sprintf("worker %c", 'A'+i), "worker", "--engine", "sglang", "--engine-url", m.url, "--kv-events", m.events,
			"--kv-events-replay", m.replay, "--peer-endpoint", peers[i], "--hint-form", "bridge", "--model", "mock-model", "--nats", ns.URL(),
			"--log-level", "warn", "--engine-timeout", "20s")
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
	if st != 400 || c.Error == nil || !strings.Contains(c.Error.Message, "context length (4096 tokens)") {
		t.Fatalf("too long for the engine: %d %+v", st, c.Error)
	}

	// Catch-up through replay: the router predicts the early prompt's 40
	// blocks cached (SGLang's signed hashes decoded and indexed).
	testutil.WaitFor(t, 10*time.Second, "mock A's early blocks in the router's index", func() bool {
		postGenerate(t, mocks[0].url, map[string]any{"input_ids": tokenPrompt(16, 90000), "sampling_params": map[string]any{"max_new_tokens": 1}})
		before := feMetric("kvmesh_router_predicted_cached_tokens_total")
		completeOnce(t, base, map[string]any{"model": "mock-model", "prompt": early, "max_tokens": 1})
		return feMetric("kvmesh_router_predicted_cached_tokens_total")-before >= 40*16
	})

	// A hint: load the holder of a prefix until the router sends a prompt
	// sharing it to the other mock, with a kv_router_hint naming the
	// holder's own hashes, signed as SGLang publishes them.
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
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
		deadline := time.Now().Add(300 * time.Millisecond)
		for hint == nil && time.Now().Before(deadline) {
			for mi, m := range mocks {
				if hs := mockHints(t, m); len(hs) > 0 {
					hint, target = &hs[0], mi
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
	if hint.Field != "kv_router_hint" || hint.SourceEndpoint != peers[1-target] || fmt.Sprint(hint.SignedHashes) != fmt.Sprint(want) {
		t.Fatalf("hint at mock %d: %+v\nwant source %s hashes %v", target, hint, peers[1-target], want)
	}

	// Cancellation: the held streams end at the engines too.
	stopStreams()
	wg.Wait()
	testutil.WaitFor(t, 10*time.Second, "no request running on the mocks", func() bool {
		return mocks[0].metric(t, "sglang:num_running_reqs")+mocks[1].metric(t, "sglang:num_running_reqs") == 0
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
			if m.metric(t, "sglang:num_running_reqs") > 0 {
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
	p := startProc(t, "bad serve", "serve", "--listen", "127.0.0.1:0", "--engine", "sglang", "--prefill-engine-url", dec.url,
		"--decode-engine-url", pre.url, "--engine-timeout", "10s")
	select {
	case <-p.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("serve with swapped roles kept running")
	}
	if want := "--prefill-engine-url " + dec.url + ": sglang engine " + dec.url + " runs --disaggregation-mode decode"; !strings.Contains(p.Stderr(), want) {
		t.Fatalf("swapped roles: %s\nwant %q", p.Stderr(), want)
	}
	p = startProc(t, "bad serve", "serve", "--listen", "127.0.0.1:0", "--engine", "sglang", "--prefill-engine-url", pre.url,
		"--decode-engine-url", dec.url, "--disagg-local-prefill-tokens", "512")
	<-p.Done()
	if want := "--disagg-local-prefill-tokens 512: sglang decode servers cannot prefill alone"; !strings.Contains(p.Stderr(), want) {
		t.Fatalf("local prefill asked for: %s\nwant %q", p.Stderr(), want)
	}
}
