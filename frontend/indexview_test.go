package frontend

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

type indexBackend struct {
	*fakeBackend
	view any
}

func (b indexBackend) IndexView() any { return b.view }

// /debug/kv-index serves the backend's index view as JSON to an admin key
// only: it is 404 without admin keys, 401 without a key, 403 with a mere
// API key, and 404 for a backend without a view.
func TestDebugIndexView(t *testing.T) {
	get := func(s *Server, auth string) (int, string) {
		req, _ := http.NewRequest("GET", "/debug/kv-index", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	const apiKey, adminKey = "sk-good-key-0123456", "admin-key-0123456789"
	keys, err := ParseAPIKeys(apiKey)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := ParseAPIKeys(adminKey)
	if err != nil {
		t.Fatal(err)
	}
	b := indexBackend{fakeBackend: &fakeBackend{reply: "x"}, view: map[string]any{"workers": []int{7}}}
	reg := prometheus.NewRegistry()
	if code, body := get(New(DefaultConfig(), b, models{testModel()}, reg, reg), "Bearer "+adminKey); code != 404 || !strings.Contains(body, "--admin-key-file") {
		t.Errorf("without admin keys: %d %s, want 404", code, body)
	}
	for _, withAPIKeys := range []bool{false, true} {
		cfg := DefaultConfig()
		cfg.AdminKeys, cfg.OpenMetrics = admin, true
		if withAPIKeys {
			cfg.APIKeys = keys
		}
		reg = prometheus.NewRegistry()
		s := New(cfg, b, models{testModel()}, reg, reg)
		if code, _ := get(s, ""); code != 401 {
			t.Errorf("API keys %v, no key: %d, want 401", withAPIKeys, code)
		}
		want := 401 // without API keys configured, it is just a wrong key
		if withAPIKeys {
			want = 403
		}
		if code, _ := get(s, "Bearer "+apiKey); code != want {
			t.Errorf("API keys %v, an API key: %d, want %d", withAPIKeys, code, want)
		}
		if code, body := get(s, "Bearer "+adminKey); code != 200 || strings.TrimSpace(body) != `{"workers":[7]}` {
			t.Errorf("API keys %v, the admin key: %d %s", withAPIKeys, code, body)
		}
		reg = prometheus.NewRegistry()
		if code, body := get(New(cfg, &fakeBackend{}, models{testModel()}, reg, reg), "Bearer "+adminKey); code != 404 || !strings.Contains(body, "no KV index") {
			t.Errorf("without a view: %d %s", code, body)
		}
	}
}
