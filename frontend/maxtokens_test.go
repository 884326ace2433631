package frontend

import (
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

// min_tokens and ignore_eos reach the engine in kv.Sampling; a request
// without max_tokens gets the model's default, raised to min_tokens, and
// --max-tokens-limit bounds what a client may ask.
func TestMinTokensIgnoreEOSAndMaxTokensLimit(t *testing.T) {
	b := &fakeBackend{reply: "hello"}
	cfg := DefaultConfig()
	cfg.MaxTokensLimit = 300
	ts := newTestServer(t, b, cfg)
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	cases := []struct {
		body     string
		status   int
		want     kv.Sampling // MaxTokens, MinTokens, IgnoreEOS checked
		errParam string
	}{
		{`{"model":"test-model",` + msgs + `,"max_tokens":8,"min_tokens":8,"ignore_eos":true}`, 200, kv.Sampling{MaxTokens: 8, MinTokens: 8, IgnoreEOS: true}, ""},
		{`{"model":"test-model",` + msgs + `}`, 200, kv.Sampling{MaxTokens: testModel().DefaultMaxTokens}, ""},
		{`{"model":"test-model",` + msgs + `,"min_tokens":290}`, 200, kv.Sampling{MaxTokens: 290, MinTokens: 290}, ""},
		{`{"model":"test-model",` + msgs + `,"max_tokens":301}`, 400, kv.Sampling{}, "max_tokens"},
		{`{"model":"test-model",` + msgs + `,"max_completion_tokens":301}`, 400, kv.Sampling{}, "max_completion_tokens"},
		{`{"model":"test-model",` + msgs + `,"min_tokens":301}`, 400, kv.Sampling{}, "min_tokens"},
	}
	for _, c := range cases {
		n := len(b.requests)
		resp, body := post(t, ts.URL+"/v1/chat/completions", c.body)
		if resp.StatusCode != c.status {
			t.Fatalf("%s: status %d %s", c.body, resp.StatusCode, body)
		}
		if c.status != 200 {
			if !strings.Contains(body, `"param":"`+c.errParam+`"`) || !strings.Contains(body, "limit of 300 tokens") {
				t.Errorf("%s: %s", c.body, body)
			}
			continue
		}
		got := b.requests[n].Sampling
		if got.MaxTokens != c.want.MaxTokens || got.MinTokens != c.want.MinTokens || got.IgnoreEOS != c.want.IgnoreEOS {
			t.Errorf("%s: sampling %+v, want max %d min %d ignore_eos %v", c.body, got, c.want.MaxTokens, c.want.MinTokens, c.want.IgnoreEOS)
		}
	}
}
