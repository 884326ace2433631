package mockengine

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

func startTRTLLM(t *testing.T, cfg TRTLLMConfig) (*TRTLLM, string) {
	t.Helper()
	if cfg.Sim.Model == "" {
		cfg.Sim = testSim()
	}
	cfg.Logger = quiet()
	m, err := NewTRTLLM(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Handler())
	t.Cleanup(func() {
		srv.Close()
		if err := m.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return m, srv.URL
}

type trtAnswer struct {
	Choices []struct {
		TokenIDs            []kv.Token      `json:"token_ids"`
		FinishReason        string          `json:"finish_reason"`
		DisaggregatedParams json.RawMessage `json:"disaggregated_params"`
	} `json:"choices"`
	Usage struct {
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	PromptTokenIDs []kv.Token `json:"prompt_token_ids"`
	Object         string     `json:"object"`
	Message        string     `json:"message"`
}

func trtPost(t *testing.T, url string, body map[string]any) (int, trtAnswer) {
	t.Helper()
	code, raw := post(t, url+"/v1/completions", body, nil)
	var a trtAnswer
	if err := json.Unmarshal(raw, &a); err != nil {
		t.Fatalf("%d %s", code, raw)
	}
	return code, a
}

// Unknown fields are refused as TensorRT-LLM refuses them, in its flat
// error shape; events and iteration stats are off unless asked for.
func TestTRTLLMStrictAndDefaults(t *testing.T) {
	_, url := startTRTLLM(t, TRTLLMConfig{})
	code, a := trtPost(t, url, map[string]any{"model": testModel, "prompt": ids(20, 5), "max_tokens": 2, "kv_hints": map[string]any{}})
	if code != 400 || a.Object != "error" || !strings.Contains(a.Message, "kv_hints") || !strings.Contains(a.Message, "Extra inputs are not permitted") {
		t.Fatalf("unknown field: %d %+v", code, a)
	}
	code, a = trtPost(t, url, map[string]any{"model": testModel, "prompt": ids(40, 5), "max_tokens": 2, "detokenize": false})
	if code != 200 || len(a.Choices[0].TokenIDs) != 2 {
		t.Fatalf("completion: %d %+v", code, a)
	}
	for _, path := range []string{"/metrics"} {
		if _, raw := get(t, url+path); strings.TrimSpace(string(raw)) != "[]" {
			t.Fatalf("%s without enable_iter_perf_stats: %s", path, raw)
		}
	}
	if _, raw := post(t, url+"/kv_cache_events", nil, nil); strings.TrimSpace(string(raw)) != "[]" {
		t.Fatalf("events without a buffer: %s", raw)
	}
}

// A full event buffer drops its oldest events: ids jump.
func TestTRTLLMEventBuffer(t *testing.T) {
	_, url := startTRTLLM(t, TRTLLMConfig{EventBufferMaxSize: 2})
	for i := range 4 {
		trtPost(t, url, map[string]any{"model": testModel, "prompt": ids(32, kv.Token(1000*(i+1))), "max_tokens": 1})
	}
	_, raw := post(t, url+"/kv_cache_events", nil, nil)
	var evs []struct {
		EventID int64 `json:"event_id"`
		Data    struct {
			Type   string `json:"type"`
			Blocks []struct {
				BlockHash uint64 `json:"block_hash"`
				Tokens    []struct {
					TokenID int64 `json:"token_id"`
				} `json:"tokens"`
			} `json:"blocks"`
		} `json:"data"`
	}
	if err := json.Unmarshal(raw, &evs); err != nil || len(evs) != 2 {
		t.Fatalf("events %s", raw)
	}
	if evs[0].EventID != 3 || evs[1].EventID != 4 || evs[1].Data.Type != "stored" || len(evs[1].Data.Blocks) != 2 ||
		len(evs[1].Data.Blocks[0].Tokens) != 16 || evs[1].Data.Blocks[0].Tokens[0].TokenID != 4000 {
		t.Fatalf("events %s", raw)
	}
}

// The context mock leases the prompt's blocks and names them in the
// opaque state; the generation mock pulls them, frees the lease and goes
// on from the first token: the output is the aggregated one.
func TestTRTLLMDisaggHandoff(t *testing.T) {
	ctxM, ctxURL := startTRTLLM(t, TRTLLMConfig{Transceiver: &TransceiverConfig{}})
	genM, genURL := startTRTLLM(t, TRTLLMConfig{Transceiver: &TransceiverConfig{}})
	prompt := ids(5*16+3, 100)
	code, c := trtPost(t, ctxURL, map[string]any{"model": testModel, "prompt": prompt, "max_tokens": 6, "seed": 3, "temperature": 0,
		"detokenize": false, "disaggregated_params": map[string]any{"request_type": "context_only", "disagg_request_id": 7}})
	if code != 200 || c.Choices[0].FinishReason != "length" || len(c.Choices[0].TokenIDs) != 1 || len(c.PromptTokenIDs) != len(prompt) {
		t.Fatalf("context answer %d %+v", code, c)
	}
	var p map[string]any
	json.Unmarshal(c.Choices[0].DisaggregatedParams, &p)
	if p["request_type"] != "context_only" || p["encoded_opaque_state"] == nil || p["disagg_request_id"] != float64(7) {
		t.Fatalf("context params %s", c.Choices[0].DisaggregatedParams)
	}
	if s := ctxM.LeaseStats(); s.Held != 1 || s.Blocks != 5 {
		t.Fatalf("leases %+v", s)
	}
	p["request_type"] = "generation_only"
	code, g := trtPost(t, genURL, map[string]any{"model": testModel, "prompt": c.PromptTokenIDs, "max_tokens": 6, "seed": 3, "temperature": 0,
		"detokenize": false, "disaggregated_params": p})
	_, agg := trtPost(t, genURL, map[string]any{"model": testModel, "prompt": prompt, "max_tokens": 6, "seed": 3, "temperature": 0, "detokenize": false})
	if code != 200 || len(g.Choices[0].TokenIDs) != 6 || g.Choices[0].TokenIDs[0] != c.Choices[0].TokenIDs[0] ||
		kvString(g.Choices[0].TokenIDs) != kvString(agg.Choices[0].TokenIDs) || g.Usage.PromptTokensDetails.CachedTokens < 5*16 {
		t.Fatalf("generation %d %+v, aggregated %+v", code, g, agg)
	}
	if s := genM.PullStats(); s.OK != 1 || s.Blocks != 5 || s.Notified != 1 {
		t.Fatalf("pulls %+v", s)
	}
	if s := ctxM.LeaseStats(); s.Consumed != 1 || s.Held != 0 {
		t.Fatalf("leases after the pull %+v", s)
	}
	// Without a transceiver, and a generation leg without state: 400.
	_, plain := startTRTLLM(t, TRTLLMConfig{})
	if code, a := trtPost(t, plain, map[string]any{"model": testModel, "prompt": prompt, "disaggregated_params": map[string]any{"request_type": "context_only"}}); code != 400 || !strings.Contains(a.Message, "cache_transceiver_config") {
		t.Fatalf("no transceiver: %d %+v", code, a)
	}
	if code, a := trtPost(t, genURL, map[string]any{"model": testModel, "prompt": prompt, "disaggregated_params": map[string]any{"request_type": "generation_only", "first_gen_tokens": []int{1}}}); code != 400 || !strings.Contains(a.Message, "encoded_opaque_state") {
		t.Fatalf("no state: %d %+v", code, a)
	}
}

func kvString(t []kv.Token) string {
	b, _ := json.Marshal(t)
	return string(b)
}
