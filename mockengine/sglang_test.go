package mockengine

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func startSGLang(t *testing.T, cfg SGLangConfig) (*SGLang, string) {
	t.Helper()
	if cfg.Sim.Model == "" {
		cfg.Sim = testSim()
	}
	cfg.Logger = quiet()
	s, err := NewSGLang(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		srv.Close()
		s.Close()
	})
	return s, srv.URL
}

func ids(n, base int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = base + i
	}
	return out
}

// SGLang's validation answers 400 in its error shape; the disaggregation
// modes require their bootstrap fields.
func TestSGLangValidation(t *testing.T) {
	_, url := startSGLang(t, SGLangConfig{})
	for _, tc := range []struct {
		body map[string]any
		want string
	}{
		{map[string]any{}, "Either text, input_ids or input_embeds"},
		{map[string]any{"input_ids": ids(4, 1), "sampling_params": map[string]any{"top_p": 0}}, "top_p must be in (0, 1]"},
		{map[string]any{"input_ids": ids(4, 1), "sampling_params": map[string]any{"max_new_tokens": 2, "min_new_tokens": 3}}, "min_new_tokens must be in [0, max_new_tokens(2)]"},
		{map[string]any{"input_ids": ids(4, 1), "lora_path": "x"}, "--enable-lora"},
		{map[string]any{"input_ids": ids(5000, 1)}, "context length"},
		{map[string]any{"input_ids": ids(4, 1), "kv_hints": map[string]any{"protocol_version": "0.1"}}, "kv_hints"},
	} {
		st, body := post(t, url+"/generate", tc.body, nil)
		var e struct {
			Object, Message string
			Code            int
		}
		_ = json.Unmarshal(body, &e)
		if st != 400 || e.Object != "error" || e.Code != 400 || !strings.Contains(e.Message, tc.want) {
			t.Errorf("%v: %d %s, want 400 %q", tc.body, st, body, tc.want)
		}
	}
	// A kv_router_hint SGLang cannot read is passed through, not refused.
	if st, body := post(t, url+"/generate", map[string]any{"input_ids": ids(4, 1), "kv_router_hint": map[string]any{"block_hashes": "x"},
		"sampling_params": map[string]any{"max_new_tokens": 1}}, nil); st != 200 {
		t.Fatalf("unreadable kv_router_hint: %d %s", st, body)
	}
	_, pre := startSGLang(t, SGLangConfig{DisaggMode: DisaggPrefill})
	if st, body := post(t, pre+"/generate", map[string]any{"input_ids": ids(4, 1)}, nil); st != 400 || !strings.Contains(string(body), "bootstrap_room is required") {
		t.Fatalf("prefill without a room: %d %s", st, body)
	}
	_, dec := startSGLang(t, SGLangConfig{DisaggMode: DisaggDecode})
	if st, body := post(t, dec+"/generate", map[string]any{"input_ids": ids(4, 1), "bootstrap_room": 1}, nil); st != 400 || !strings.Contains(string(body), "bootstrap_host, bootstrap_port and bootstrap_room") {
		t.Fatalf("decode without bootstrap: %d %s", st, body)
	}
}

// A decode whose room no prefill takes aborts with a 5xx once its
// bootstrap wait is over; SGLang's fake bootstrap host makes it compute
// the prompt itself.
func TestSGLangDecodeBootstrap(t *testing.T) {
	p, _ := startSGLang(t, SGLangConfig{DisaggMode: DisaggPrefill})
	_, dec := startSGLang(t, SGLangConfig{DisaggMode: DisaggDecode, BootstrapTimeout: 200 * time.Millisecond})
	start := time.Now()
	st, body := post(t, dec+"/generate", map[string]any{"input_ids": ids(40, 1), "bootstrap_host": "127.0.0.1",
		"bootstrap_port": p.BootstrapPort(), "bootstrap_room": 7, "sampling_params": map[string]any{"max_new_tokens": 3}}, nil)
	if st != 500 || !strings.Contains(string(body), "KV transfer failed") || time.Since(start) > 3*time.Second {
		t.Fatalf("unknown room: %d %s after %v", st, body, time.Since(start))
	}
	st, body = post(t, dec+"/generate", map[string]any{"input_ids": ids(40, 1), "bootstrap_host": FakeBootstrapHost,
		"bootstrap_room": 0, "sampling_params": map[string]any{"max_new_tokens": 3}}, nil)
	var out sglFrame
	if st != 200 || json.Unmarshal(body, &out) != nil || len(out.OutputIDs) != 3 || out.MetaInfo.FinishReason == nil || out.MetaInfo.FinishReason.Type != "length" {
		t.Fatalf("fake bootstrap host: %d %s", st, body)
	}
}
