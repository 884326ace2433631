package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/engine/vllm"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// `kvmesh serve --engine vllm` with a prefill and a decode worker in front
// of two real CPU `vllm serve` whose KV connector is vLLM's
// ExampleConnector on one shared directory: the connector that runs on
// CPU in the installed vLLM (its NixlConnector needs the nixl package,
// which the CPU build lacks: "RuntimeError: NIXL is not available" at
// engine start). The prefill engine saves the prompt's KV there, the
// decode engine finds it by the prompt's tokens and loads it; the
// connector answers the prefill with no kv_transfer_params, which
// --kv-transfer shared-storage tells kvmesh.
func TestRealVLLMDisagg(t *testing.T) {
	py := vllmPython(t)
	model := tinyModel(t)
	store := t.TempDir()
	kvc, _ := json.Marshal(map[string]any{"kv_connector": "ExampleConnector", "kv_role": "kv_both",
		"kv_connector_extra_config": map[string]any{"shared_storage_path": store}})
	engine := []string{"--max-model-len", "1024", "--kv-transfer-config", string(kvc)}
	vs := startRealVLLMs(t, py, model, engine, engine)
	pre, dec := vs[0], vs[1]
	serveOver := func(args ...string) *served {
		return startServe(t, append([]string{"--engine", "vllm", "--block-size", "32", "--tokenizer", model,
			"--router-temperature", "0"}, args...)...)
	}
	// kvmesh's workers reach the engines through recorders of what each
	// leg asked.
	preLegs, decLegs := recordCompletions(t, pre.url), recordCompletions(t, dec.url)
	pd := []string{"--prefill-engine-url", preLegs.url, "--decode-engine-url", decLegs.url, "--prefill-kv-events", pre.events,
		"--decode-kv-events", dec.events, "--disagg-local-prefill-tokens", "0"}
	// Prompt tokens by where the engine got their KV: local_compute,
	// local_cache_hit or external_kv_transfer (the connector's load).
	bySource := func(v *realVLLM, source string) int {
		n := 0.0
		for k, x := range testutil.Scrape(t, v.url+"/metrics") {
			if strings.HasPrefix(k, "vllm:prompt_tokens_by_source_total{") && strings.Contains(k, `source="`+source+`"`) {
				n += x
			}
		}
		return int(n)
	}
	disaggPaths := func(s *served) float64 {
		v, _ := metric(t, s.base, `kvmesh_fleet_requests_by_path_total{path="disagg",reason=""}`)
		return v
	}
	greedy := func(t *testing.T, s *served, p []uint32) completion {
		t.Helper()
		st, c := completeOnce(t, s.base, map[string]any{"model": realModel, "prompt": p, "max_tokens": 8, "temperature": 0, "ignore_eos": true})
		if st != 200 || len(c.Choices) != 1 {
			if c.Error != nil {
				t.Fatalf("greedy request: %d %s", st, c.Error.Message)
			}
			t.Fatalf("greedy request: %d %+v", st, c)
		}
		return c
	}
	// 6 blocks and 5 tokens: the connector saves and loads the 192
	// tokens of whole blocks; the decode engine computes the last 5.
	const promptLen, saved = 6*realBlock + 5, 6 * realBlock
	prompts := [][]uint32{realPrompt(promptLen, 301), realPrompt(promptLen, 302)}
	texts := make([]string, len(prompts))

	t.Run("prefill and decode legs", func(t *testing.T) {
		s := serveOver(append(pd, "--kv-transfer", "shared-storage")...)
		defer s.stop(t)
		for i, p := range prompts {
			computed, loaded, decComputed, paths := bySource(pre, "local_compute"), bySource(dec, "external_kv_transfer"), bySource(dec, "local_compute"), disaggPaths(s)
			preLegs.reset()
			decLegs.reset()
			c := greedy(t, s, p)
			texts[i] = c.Choices[0].Text
			if c.Usage.CompletionTokens != 8 || c.Usage.PromptTokens != promptLen {
				t.Fatalf("prompt %d through P/D: usage %+v, want %d prompt and 8 completion tokens", i, c.Usage, promptLen)
			}
			if d := disaggPaths(s) - paths; d != 1 {
				t.Fatalf("prompt %d: %v disaggregated attempts, want 1", i, d)
			}
			// The prefill leg asked for a remote decode and one token; the
			// decode leg carried its answer's parameters unchanged.
			pl, dl := preLegs.bodies(), decLegs.bodies()
			if len(pl) != 1 || len(dl) != 1 {
				t.Fatalf("prompt %d: %d prefill and %d decode legs, want 1 each", i, len(pl), len(dl))
			}
			var asked struct {
				DoRemoteDecode bool `json:"do_remote_decode"`
			}
			json.Unmarshal(pl[0]["kv_transfer_params"], &asked)
			if !asked.DoRemoteDecode || string(pl[0]["max_tokens"]) != "1" {
				t.Fatalf("prompt %d: prefill leg kv_transfer_params %s, max_tokens %s", i, pl[0]["kv_transfer_params"], pl[0]["max_tokens"])
			}
			if got := string(dl[0]["kv_transfer_params"]); got != vllm.SharedStorageParams || string(dl[0]["max_tokens"]) != "8" {
				t.Fatalf("prompt %d: decode leg kv_transfer_params %s, max_tokens %s; the prefill answered %s", i, got, dl[0]["max_tokens"], vllm.SharedStorageParams)
			}
			// The prefill engine computed the whole prompt; the decode
			// engine loaded its whole blocks through the connector and
			// computed only the rest.
			if d := bySource(pre, "local_compute") - computed; d != promptLen {
				t.Fatalf("prompt %d: the prefill engine computed %d prompt tokens, want %d", i, d, promptLen)
			}
			if d := bySource(dec, "external_kv_transfer") - loaded; d != saved {
				t.Fatalf("prompt %d: the decode engine loaded %d tokens' KV from the prefill engine's, want %d\n%s", i, d, saved, dec.logTail(2<<10))
			}
			if d := bySource(dec, "local_compute") - decComputed; d != promptLen-saved {
				t.Fatalf("prompt %d: the decode engine computed %d prompt tokens, want %d", i, d, promptLen-saved)
			}
		}
		if ents, err := os.ReadDir(store); err != nil || len(ents) != len(prompts) {
			t.Fatalf("shared storage holds %d prompts' KV (%v), want %d", len(ents), err, len(prompts))
		}
	})

	t.Run("the same answer as aggregated", func(t *testing.T) {
		if texts[0] == "" {
			t.Skip("no P/D answers")
		}
		// The prefill engine serves the prompts whole, from the KV it
		// computed for their prefill legs.
		s := serveOver("--engine-url", pre.url, "--kv-events", pre.events)
		defer s.stop(t)
		for i, p := range prompts {
			if c := greedy(t, s, p); c.Choices[0].Text != texts[i] || c.Usage.CompletionTokens != 8 {
				t.Fatalf("prompt %d: aggregated %q (%d tokens), P/D %q", i, c.Choices[0].Text, c.Usage.CompletionTokens, texts[i])
			}
		}
	})

	t.Run("without --kv-transfer the prefill's answer is final", func(t *testing.T) {
		// The connector gives no parameters: by the NixlConnector contract
		// that is a prefill that ended, so no decode leg follows and the
		// answer is its one token.
		s := serveOver(pd...)
		defer s.stop(t)
		loaded := bySource(dec, "external_kv_transfer")
		if c := greedy(t, s, realPrompt(promptLen, 303)); c.Usage.CompletionTokens != 1 {
			t.Fatalf("without --kv-transfer: %d completion tokens, want the prefill's 1", c.Usage.CompletionTokens)
		}
		if d := bySource(dec, "external_kv_transfer") - loaded; d != 0 {
			t.Fatalf("without --kv-transfer the decode engine loaded %d tokens", d)
		}
	})
}

// completionRecorder is a loopback reverse proxy to an engine that keeps
// the bodies of its POST /v1/completions.
type completionRecorder struct {
	url string
	mu  sync.Mutex
	got []map[string]json.RawMessage
}

func recordCompletions(t *testing.T, engine string) *completionRecorder {
	t.Helper()
	target, err := url.Parse(engine)
	if err != nil {
		t.Fatal(err)
	}
	r := &completionRecorder{}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.FlushInterval = -1 // streams pass as they come
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method == http.MethodPost && req.URL.Path == "/v1/completions" {
			b, _ := io.ReadAll(req.Body)
			var body map[string]json.RawMessage
			json.Unmarshal(b, &body)
			r.mu.Lock()
			r.got = append(r.got, body)
			r.mu.Unlock()
			req.Body = io.NopCloser(bytes.NewReader(b))
		}
		proxy.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	r.url = srv.URL
	return r
}

func (r *completionRecorder) reset() {
	r.mu.Lock()
	r.got = nil
	r.mu.Unlock()
}

func (r *completionRecorder) bodies() []map[string]json.RawMessage {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]map[string]json.RawMessage(nil), r.got...)
}
