package frontend

import (
	"strings"
	"testing"
)

// cache_salt reaches the backend on both endpoints; a bad one is a 400
// naming it, as vLLM answers.
func TestCacheSaltReachesBackend(t *testing.T) {
	b := &fakeBackend{reply: "ok"}
	ts := newTestServer(t, b, DefaultConfig())
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"test-model","messages":[{"role":"user","content":"hi"}],"cache_salt":"tenant-a"}`},
		{"/v1/completions", `{"model":"test-model","prompt":"hi","cache_salt":"tenant-a"}`},
		{"/v1/completions", `{"model":"test-model","prompt":"hi","cache_salt":null}`},
	} {
		if resp, body := post(t, ts.URL+c.path, c.body); resp.StatusCode != 200 {
			t.Fatalf("%s %s: %d %s", c.path, c.body, resp.StatusCode, body)
		}
	}
	if len(b.requests) != 3 {
		t.Fatalf("%d requests reached the backend", len(b.requests))
	}
	for i, want := range []string{"tenant-a", "tenant-a", ""} {
		if got := b.requests[i].CacheSalt; got != want {
			t.Errorf("request %d: backend saw cache salt %q, want %q", i, got, want)
		}
	}
	for _, c := range []struct{ body, msg string }{
		{`"cache_salt":""`, "must be a non-empty string"},
		{`"cache_salt":7`, "expected a string"},
		{`"cache_salt":["a"]`, "expected a string"},
		{`"cache_salt":"` + strings.Repeat("s", maxCacheSalt+1) + `"`, "limit 1024"},
	} {
		resp, body := post(t, ts.URL+"/v1/chat/completions", `{"model":"test-model","messages":[{"role":"user","content":"hi"}],`+c.body+`}`)
		if resp.StatusCode != 400 || !strings.Contains(body, `"param":"cache_salt"`) || !strings.Contains(body, c.msg) {
			t.Errorf("%s: %d %s", c.body, resp.StatusCode, body)
		}
	}
	if len(b.requests) != 3 {
		t.Fatalf("a rejected salt reached the backend (%d requests)", len(b.requests))
	}
}
