package main

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/fleet"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

var serveModeLine = regexp.MustCompile(`^kvmesh serve: model \S+ on .* \(router ([^)]*)\); OpenAI API at (http://\S+/v1) `)

// startServeOver runs serve --engine kind over the mocks with no event
// flags; it returns serve and the router part of its start-up line.
func startServeOver(t *testing.T, kind string, mocks []*mockProc) (*served, string) {
	t.Helper()
	urls := make([]string, len(mocks))
	for i, m := range mocks {
		urls[i] = m.url
	}
	args := append([]string{"serve", "--listen", "127.0.0.1:0", "--log-level", "warn", "--engine", kind,
		"--engine-url", strings.Join(urls, ",")}, adminKeyArgs(t)...)
	p := startProc(t, "kvmesh serve", args...)
	m := p.Expect(serveModeLine, 30*time.Second)
	return &served{Proc: p, base: m[2]}, m[1]
}

// sharedPrefixBurst sends n completions, one after another, that share a
// prompt of prefix tokens (each with its own 16-token tail); between them
// settle waits for what the router learns from the last one.
func sharedPrefixBurst(t *testing.T, base string, n, prefix int, settle func(i int)) {
	t.Helper()
	shared := tokenPrompt(prefix, 9000)
	for i := range n {
		p := append(append([]uint32(nil), shared...), tokenPrompt(16, uint32(70000+16*i))...)
		if st, c := completeOnce(t, base, map[string]any{"model": "mock-model", "prompt": p, "max_tokens": 2}); st != 200 {
			t.Fatalf("request %d: %d %+v", i, st, c)
		}
		settle(i)
	}
}

// servedBy counts the workers serve sent prompt tokens to (its per-worker
// series), with the count per worker.
func servedBy(t *testing.T, root string) (workers int, perWorker []float64) {
	t.Helper()
	for k, v := range testutil.Scrape(t, root+"/metrics") {
		if strings.HasPrefix(k, "kvmesh_fleet_worker_prompt_tokens_total{") {
			perWorker = append(perWorker, v)
			if v > 0 {
				workers++
			}
		}
	}
	return workers, perWorker
}

// The new user: `serve --engine vllm` over two engines and no
// --kv-events. serve routes kv-approx and says so on its start-up line, in
// /health's warnings and on the dashboard; 7 requests sharing a
// 1,500-token prompt all land on one engine (the KV router without events
// spread them 4/3).
func TestServeVLLMWithoutEventsRoutesKVApprox(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	mocks := []*mockProc{startMockVLLM(t, "mock A", "--speedup-ratio", "0"), startMockVLLM(t, "mock B", "--speedup-ratio", "0")}
	s, mode := startServeOver(t, "vllm", mocks)
	defer s.stop(t)
	if mode != "kv-approx: no KV events from the engines" {
		t.Fatalf("start-up line's router %q", mode)
	}
	root := strings.TrimSuffix(s.base, "/v1")
	var health struct {
		Status   string
		Warnings []string
	}
	getJSON(t, root+"/health", &health)
	if len(health.Warnings) != 1 || !strings.HasPrefix(health.Warnings[0], fleet.NoEventsWarning) {
		t.Fatalf("/health %+v, want the warning %q", health, fleet.NoEventsWarning)
	}
	var snap struct{ Fleet fleet.FleetStatus }
	getJSON(t, root+"/dashboard/api/snapshot", &snap)
	if len(snap.Fleet.Warnings) != 1 || snap.Fleet.Warnings[0] != health.Warnings[0] {
		t.Fatalf("dashboard warnings %q, want /health's %q", snap.Fleet.Warnings, health.Warnings)
	}
	sharedPrefixBurst(t, s.base, 7, 1500, func(int) {})
	if n, per := servedBy(t, root); n != 1 {
		t.Fatalf("7 requests sharing a prefix were served by %d engines (prompt tokens %v), want 1", n, per)
	}
}

// `serve --engine trtllm` without --kv-events polls each engine's
// /kv_cache_events at its --engine-url and routes kv by them: the router's
// index fills, and a shared prefix stays on the engine that holds it.
func TestServeTRTLLMPollsEventsByDefault(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	a, b := startMockTRTLLM(t, "mock A", "--speedup-ratio", "0"), startMockTRTLLM(t, "mock B", "--speedup-ratio", "0")
	mocks := []*mockProc{a(), b()}
	s, mode := startServeOver(t, "trtllm", mocks)
	defer s.stop(t)
	if mode != "kv" {
		t.Fatalf("start-up line's router %q, want kv", mode)
	}
	root := strings.TrimSuffix(s.base, "/v1")
	var health struct{ Warnings []string }
	getJSON(t, root+"/health", &health)
	if len(health.Warnings) != 0 {
		t.Fatalf("/health warnings %q: the engines' events are polled", health.Warnings)
	}
	sharedPrefixBurst(t, s.base, 7, 1500, func(i int) {
		if i > 0 {
			return
		}
		// The first prompt's blocks reach the router through the poll.
		testutil.WaitFor(t, 10*time.Second, "the router's index to hold the first prompt", func() bool {
			var v fleet.IndexView
			getAdminJSON(t, root+"/debug/kv-index", &v)
			for _, w := range v.Workers {
				if len(w.Blocks["device"]) > 0 {
					return true
				}
			}
			return false
		})
	})
	if n, per := servedBy(t, root); n != 1 {
		t.Fatalf("7 requests sharing a prefix were served by %d engines (prompt tokens %v), want 1", n, per)
	}
}

// getJSON decodes the JSON at url into v.
func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	r, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("%s: %v: %s", url, err, body)
	}
}
