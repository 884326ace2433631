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

// /debug/kv-index serves the backend's index view as JSON, 404s for a
// backend without one, and needs a key when keys are configured.
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
	reg := prometheus.NewRegistry()
	b := indexBackend{fakeBackend: &fakeBackend{reply: "x"}, view: map[string]any{"workers": []int{7}}}
	if code, body := get(New(DefaultConfig(), b, models{testModel()}, reg, reg), ""); code != 200 || strings.TrimSpace(body) != `{"workers":[7]}` {
		t.Errorf("with a view: %d %s", code, body)
	}
	reg = prometheus.NewRegistry()
	if code, body := get(New(DefaultConfig(), &fakeBackend{}, models{testModel()}, reg, reg), ""); code != 404 || !strings.Contains(body, "no KV index") {
		t.Errorf("without a view: %d %s", code, body)
	}
	keys, err := ParseAPIKeys("sk-good")
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.APIKeys, cfg.OpenMetrics = keys, true
	reg = prometheus.NewRegistry()
	s := New(cfg, b, models{testModel()}, reg, reg)
	if code, _ := get(s, ""); code != 401 {
		t.Errorf("with keys, no key: %d, want 401", code)
	}
	if code, _ := get(s, "Bearer sk-good"); code != 200 {
		t.Errorf("with keys and the key: %d, want 200", code)
	}
}
