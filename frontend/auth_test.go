package frontend

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

func TestParseAPIKeys(t *testing.T) {
	k, err := ParseAPIKeys("# ops keys\nsk-one-0123456789abc\n\n  sk-two-0123456789abc  \n", "sk-three-0123456789abc,sk-four-0123456789abc")
	if err != nil || k.Len() != 4 {
		t.Fatalf("%v keys, %v", k, err)
	}
	for _, key := range []string{"sk-one-0123456789abc", "sk-two-0123456789abc", "sk-three-0123456789abc", "sk-four-0123456789abc"} {
		if !k.valid(key) {
			t.Errorf("%s refused", key)
		}
	}
	for _, key := range []string{"", "sk-one-0123456789ab", "sk-one-0123456789abc ", "sk-one-0123456789abcx", "# ops keys"} {
		if k.valid(key) {
			t.Errorf("%q accepted", key)
		}
	}
	for _, bad := range []string{"", "\n# only a comment\n", "sk a-0123456789abcdef", "sk-short"} {
		if _, err := ParseAPIKeys(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// With keys configured every API route needs a valid bearer key and answers
// OpenAI's 401 otherwise; probes stay open and /metrics follows OpenMetrics.
func TestAPIKeys(t *testing.T) {
	keys, err := ParseAPIKeys("sk-good-key-0123456")
	if err != nil {
		t.Fatal(err)
	}
	for _, open := range []bool{false, true} {
		b := &fakeBackend{reply: "ok"}
		cfg := DefaultConfig()
		cfg.APIKeys, cfg.OpenMetrics = keys, open
		reg := prometheus.NewRegistry()
		ts := httptest.NewServer(New(cfg, b, models{testModel()}, reg, reg))
		do := func(method, path, auth string) (int, string) {
			var body *strings.Reader
			if method == "POST" {
				body = strings.NewReader(`{"model":"test-model","messages":[{"role":"user","content":"hi"}]}`)
			} else {
				body = strings.NewReader("")
			}
			req, _ := http.NewRequest(method, ts.URL+path, body)
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		for _, c := range []struct {
			method, path, auth string
			want               int
			msg                string
		}{
			{"POST", "/v1/chat/completions", "", 401, "You didn't provide an API key"},
			{"POST", "/v1/chat/completions", "Basic c2stZ29vZA==", 401, "You didn't provide an API key"},
			{"POST", "/v1/chat/completions", "Bearer sk-bad-key-0123456", 401, `"code":"invalid_api_key"`},
			{"POST", "/v1/chat/completions", "Bearer sk-good-key-012345", 401, `"code":"invalid_api_key"`},
			{"GET", "/v1/models", "", 401, `"type":"invalid_request_error"`},
			{"GET", "/nowhere", "", 401, "API key"}, // unknown routes tell nothing either
			{"POST", "/v1/chat/completions", "Bearer sk-good-key-0123456", 200, `"chat.completion"`},
			{"POST", "/v1/chat/completions", "bearer sk-good-key-0123456", 200, `"chat.completion"`},
			{"GET", "/v1/models", "Bearer sk-good-key-0123456", 200, "test-model"},
			{"GET", "/health", "", 200, ""},
			{"GET", "/live", "", 200, "live"},
			{"GET", "/metrics", "Bearer sk-good-key-0123456", 200, "kvmesh_frontend_unauthorized_total"},
		} {
			code, body := do(c.method, c.path, c.auth)
			if code != c.want || !strings.Contains(body, c.msg) {
				t.Errorf("%s %s %q: %d %s, want %d with %q", c.method, c.path, c.auth, code, body, c.want, c.msg)
			}
		}
		code, _ := do("GET", "/metrics", "")
		if want := map[bool]int{false: 401, true: 200}[open]; code != want {
			t.Errorf("open metrics %v: /metrics without a key answered %d, want %d", open, code, want)
		}
		if n := len(b.requests); n != 2 {
			t.Errorf("%d requests reached the backend, want the 2 with a good key", n)
		}
		want := 6.0
		if !open {
			want = 7
		}
		if v := testutil.Value(t, reg, "kvmesh_frontend_unauthorized_total"); v != want {
			t.Errorf("unauthorized counted %v, want %v", v, want)
		}
		ts.Close()
	}
}
