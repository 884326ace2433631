package frontend

import (
	"context"
	"net/http"
	"testing"

	"github.com/kvmesh/kvmesh/internal/stages"
)

// A streaming chat request passes the frontend's stages once each, and
// /metrics shows them (the fake backend marks no fleet stage).
func TestStagesObservedPerRequest(t *testing.T) {
	b := &fakeBackend{reply: "Hello, world!"}
	ts := newTestServer(t, b, DefaultConfig())
	for range 2 {
		resp, body := post(t, ts.URL+"/v1/chat/completions", `{"model":"test-model","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
	}
	snap, err := stages.Scrape(context.Background(), http.DefaultClient, ts.URL+"/metrics", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []stages.Stage{stages.ReadBody, stages.Parse, stages.Tokenize, stages.FirstToken, stages.FirstWrite} {
		if n := snap[s.String()].Total(); n != 2 {
			t.Errorf("stage %s observed %d times over 2 requests, want 2", s, n)
		}
	}
	if n := snap[stages.Route.String()].Total(); n != 0 {
		t.Errorf("route observed %d times without a fleet", n)
	}
}
