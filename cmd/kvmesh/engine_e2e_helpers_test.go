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
	"github.com/kvmesh/kvmesh/mockengine"
	"github.com/openai/openai-go/v3"
)

// What the real-engine e2e tests (vllm_*, sglang_*, trtllm_*) share: the
// mock engines, the workers and frontend in front of them, and the checks
// every adapter must pass the same way.

var (
	mockLine   = regexp.MustCompile(`^kvmesh mock-engine (\S+): serving \S+ on (http://\S+) `)
	mockEvents = regexp.MustCompile(`^  rank 0: kv events (\S+), replay (\S+)`)
)

// mockProc is a running `kvmesh mock-engine KIND`: kind is the --engine
// that attaches to it, events and replay where its KV events come from
// (for trtllm, polled at its URL: no replay).
type mockProc struct {
	*testutil.Proc
	kind, url, events, replay string
}

// startMock starts `kvmesh mock-engine` with args; ready waits until it
// serves (and with ZMQ events, until it names rank 0's endpoints).
func startMock(t *testing.T, name string, zmq bool, args ...string) (ready func() *mockProc) {
	t.Helper()
	p := startProc(t, name, append([]string{"mock-engine"}, args...)...)
	return func() *mockProc {
		t.Helper()
		m := p.Expect(mockLine, 20*time.Second)
		mp := &mockProc{Proc: p, kind: m[1], url: m[2], events: m[2]}
		if zmq {
			e := p.Expect(mockEvents, 5*time.Second)
			mp.events, mp.replay = e[1], e[2]
		}
		return mp
	}
}

// startMockVLLM starts `kvmesh mock-engine vllm` serving mock-model in
// 16-token blocks, its KV events and replay on loopback.
func startMockVLLM(t *testing.T, name string, args ...string) *mockProc {
	t.Helper()
	return startMock(t, name, true, append([]string{"vllm", "mock-model", "--port", "0", "--block-size", "16", "--blocks", "1024",
		"--kv-events-endpoint", "tcp://127.0.0.1:0", "--kv-events-replay-endpoint", "tcp://127.0.0.1:0", "--log-level", "warn"}, args...)...)()
}

// startMockSGLang starts `kvmesh mock-engine sglang` serving mock-model in
// 16-token pages, its KV events and replay on loopback.
func startMockSGLang(t *testing.T, name string, args ...string) *mockProc {
	t.Helper()
	return startMock(t, name, true, append([]string{"sglang", "--served-model-name", "mock-model", "--port", "0", "--page-size", "16",
		"--blocks", "1024", "--kv-events-endpoint", "tcp://127.0.0.1:0", "--kv-events-replay-endpoint", "tcp://127.0.0.1:0",
		"--disaggregation-bootstrap-port", "0", "--log-level", "warn"}, args...)...)()
}

// startMockTRTLLM starts `kvmesh mock-engine trtllm` serving mock-model
// with events and iteration stats on; ready waits for it, so that several
// start at once.
func startMockTRTLLM(t *testing.T, name string, args ...string) (ready func() *mockProc) {
	t.Helper()
	return startMock(t, name, false, append([]string{"trtllm", "mock-model", "--port", "0", "--blocks", "1024",
		"--kv-event-buffer-max-size", "4096", "--enable-iter-perf-stats", "--log-level", "warn"}, args...)...)
}

// metric sums a series of the mock's /metrics over its labels.
func (m *mockProc) metric(t *testing.T, name string) float64 {
	t.Helper()
	return metricSum(t, m.url+"/metrics", name)
}

// startWorker starts `kvmesh worker --engine KIND` over the mock (its URL
// and KV events) on natsURL with extra flags (a later one wins), and waits
// until it serves mock-model.
func (m *mockProc) startWorker(t *testing.T, name, natsURL string, extra ...string) *testutil.Proc {
	t.Helper()
	args := []string{"worker", "--engine", m.kind, "--engine-url", m.url, "--kv-events", m.events}
	if m.replay != "" {
		args = append(args, "--kv-events-replay", m.replay)
	}
	args = append(args, "--nats", natsURL, "--log-level", "warn", "--engine-timeout", "20s")
	w := startProc(t, name, append(args, extra...)...)
	if got := w.Expect(workerLine, 30*time.Second); got[3] != "mock-model" {
		t.Fatalf("%s ready line %v", name, got)
	}
	return w
}

// startFrontendProc starts `kvmesh frontend` for mock-model on natsURL and
// waits until its /health answers 200; it returns the API base.
func startFrontendProc(t *testing.T, natsURL string, args ...string) string {
	t.Helper()
	fe := startProc(t, "frontend", append([]string{"frontend", "--nats", natsURL, "--model", "mock-model", "--listen", "127.0.0.1:0",
		"--log-level", "warn"}, args...)...)
	base := fe.Expect(frontendLine, 30*time.Second)[1]
	testutil.WaitFor(t, 20*time.Second, "the frontend ready", func() bool {
		resp, err := http.Get(strings.TrimSuffix(base, "/v1") + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return base
}

// expectRefused runs a kvmesh command that must fail at start, its stderr
// naming want.
func expectRefused(t *testing.T, want string, args ...string) {
	t.Helper()
	p := startProc(t, "refused "+args[0], args...)
	select {
	case <-p.Done():
	case <-time.After(20 * time.Second):
		t.Fatalf("%v: kept running", args)
	}
	if p.Err() == nil || !strings.Contains(p.Stderr(), want) {
		t.Errorf("%v: exit %v, stderr %q, want %q", args, p.Err(), p.Stderr(), want)
	}
}

// metricSum sums a series of the /metrics at url over its labels.
func metricSum(t *testing.T, url, name string) float64 {
	t.Helper()
	var sum float64
	for k, v := range testutil.Scrape(t, url) {
		if k == name || strings.HasPrefix(k, name+"{") {
			sum += v
		}
	}
	return sum
}

// mockHints are the KV hints a mock engine has received.
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

// startHintFleet puts a worker over each mock, each with a KV peer service
// (extra: more worker flags), and a frontend in front of them; it checks
// they registered as hint targets in 16-token blocks and serve
// completions, and returns the API base and the peer endpoints in mock
// order.
func startHintFleet(t *testing.T, natsURL string, mocks []*mockProc, extra ...string) (base string, peers []string) {
	t.Helper()
	for i, m := range mocks {
		peers = append(peers, peerService(t))
		m.startWorker(t, fmt.Sprintf("worker %c", 'A'+i), natsURL, append([]string{"--peer-endpoint", peers[i], "--model", "mock-model"}, extra...)...)
	}
	base = startFrontendProc(t, natsURL)
	checkRegistered(t, watchWorkers(t, natsURL, "mock-model", len(mocks)), 16, true)
	checkCompletions(t, base)
	return base, peers
}

// checkServed sends a completion and a chat through serve; the chat
// template writes special tokens (ChatML markers) the engine must take as
// ids.
func checkServed(t *testing.T, base string) {
	t.Helper()
	st, c := completeOnce(t, base, map[string]any{"model": "mock-model", "prompt": tokenPrompt(40, 5), "max_tokens": 4})
	if st != 200 || c.Usage.CompletionTokens != 4 {
		t.Fatalf("completion through serve: %d %+v", st, c)
	}
	client := newClient(base)
	chat, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "mock-model",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello there")}, MaxTokens: openai.Int(6)})
	if err != nil || chat.Usage.CompletionTokens == 0 {
		t.Fatalf("chat through serve: %v %+v", err, chat)
	}
}

// checkCompletions sends one completion not streamed, then one streamed.
func checkCompletions(t *testing.T, base string) {
	t.Helper()
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
}

// awaitHint loads the holder of shared (already served once) with long
// streams of prompts that extend it until the router sends one to another
// mock with a KV hint; it returns the first hint a mock received and that
// mock's index. stop cancels the streams and waits for them to end.
func awaitHint(t *testing.T, base string, mocks []*mockProc, shared []uint32) (hint *mockengine.HintRecord, target int, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	stop = func() {
		cancel()
		wg.Wait()
	}
	for i := 0; hint == nil && i < 40; i++ {
		p := append(append([]uint32(nil), shared...), tokenPrompt(16, uint32(60000+16*i))...)
		wg.Go(func() {
			resp, err := tryCompletion(ctx, base, map[string]any{"model": "mock-model", "prompt": p, "max_tokens": 3000, "stream": true,
				"ignore_eos": true})
			if err != nil {
				return // cancelled by stop
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
		stop()
		t.Fatal("no hint reached a mock")
	}
	return hint, target, stop
}

// checkMigrationOnKill streams a long completion and SIGKILLs the mock
// running it (by its running-requests series) after five chunks: the
// stream must migrate to another engine and complete.
func checkMigrationOnKill(t *testing.T, base string, mocks []*mockProc, running string) {
	t.Helper()
	resp := postCompletion(t, context.Background(), base, map[string]any{"model": "mock-model", "prompt": tokenPrompt(64, 777),
		"max_tokens": 200, "stream": true, "ignore_eos": true})
	defer resp.Body.Close()
	var killed bool
	chunks, done, msg := streamTokens(t, resp.Body, func(n int) {
		if n != 5 || killed {
			return
		}
		for _, m := range mocks {
			if m.metric(t, running) > 0 {
				m.Signal(syscall.SIGKILL)
				killed = true
			}
		}
	})
	if !killed || !done || msg != "" || chunks < 100 {
		t.Fatalf("migration: killed %v, chunks %d, done %v, error %q", killed, chunks, done, msg)
	}
	if n := metricSum(t, strings.TrimSuffix(base, "/v1")+"/metrics", "kvmesh_frontend_migrations_total"); n < 1 {
		t.Fatalf("migrations %v", n)
	}
}

// checkRegistered checks every worker of mock-model in discovery
// registered blockSize and whether it takes hints (with, then, one control
// endpoint).
func checkRegistered(t *testing.T, ws *workerSet, blockSize int, hints bool) {
	t.Helper()
	for _, in := range ws.watcher.Instances() {
		if in.AcceptsHints == nil || *in.AcceptsHints != hints || (hints && len(in.ControlEndpoints) != 1) || in.BlockSize != blockSize {
			t.Fatalf("registration %+v", in)
		}
	}
}
