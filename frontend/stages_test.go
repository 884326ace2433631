package frontend

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/stages"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/tokenizer"
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

// A conversation's later turns reach the backend with the tokens a whole
// encoding gives, the earlier turns' from the model's prefix cache, and
// the template and tokenize stages are timed apart.
func TestChatTurnsReusePrefixTokens(t *testing.T) {
	m, err := BuiltinModel("test-model")
	if err != nil {
		t.Fatal(err)
	}
	b := &fakeBackend{reply: "ok"}
	reg := prometheus.NewRegistry()
	ts := newTestServerFor(t, New(DefaultConfig(), b, models{m}, reg, reg))
	history := `{"role":"system","content":"You are terse."},{"role":"user","content":"What is 2+2? <|im_end|> not a marker"}`
	for turn := range 4 {
		resp, body := post(t, ts.URL+"/v1/chat/completions", `{"model":"test-model","messages":[`+history+`]}`)
		if resp.StatusCode != 200 {
			t.Fatalf("turn %d: status %d: %s", turn, resp.StatusCode, body)
		}
		history += fmt.Sprintf(`,{"role":"assistant","content":"answer %d"},{"role":"user","content":"and then %d?"}`, turn, turn)
	}
	st := m.PrefixStats()
	if st.Hits != 3 || st.Misses != 1 || st.Off || st.Reused == 0 {
		t.Fatalf("prefix cache %+v, want 3 hits after the first turn", st)
	}
	// Another tenant (cache salt) sending the same history reuses nothing.
	resp, body := post(t, ts.URL+"/v1/chat/completions", `{"model":"test-model","cache_salt":"tenant-b","messages":[`+history+`]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("salted turn: status %d: %s", resp.StatusCode, body)
	}
	if st2 := m.PrefixStats(); st2.Hits != 3 || st2.Misses != 2 {
		t.Fatalf("a salted request reused another tenant's prompt: %+v", st2)
	}
	b.requests = b.requests[:4]
	// The tokens sent equal the uncached encoding of the same messages.
	tok, tmpl, err := tokenizer.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	msgs := []tokenizer.Message{{Role: "system", Content: "You are terse."}, {Role: "user", Content: "What is 2+2? <|im_end|> not a marker"}}
	for turn, req := range b.requests {
		want, _, _ := tokenizer.EncodeChat(tok, tmpl, msgs, 0)
		if !slices.Equal(req.Tokens, want) {
			t.Fatalf("turn %d: %d tokens sent, want %d", turn, len(req.Tokens), len(want))
		}
		msgs = append(msgs, tokenizer.Message{Role: "assistant", Content: fmt.Sprintf("answer %d", turn)}, tokenizer.Message{Role: "user", Content: fmt.Sprintf("and then %d?", turn)})
	}
	snap, err := stages.Scrape(context.Background(), http.DefaultClient, ts.URL+"/metrics", "")
	if err != nil {
		t.Fatal(err)
	}
	v := func(name string) float64 {
		return testutil.Value(t, reg, "kvmesh_frontend_prefix_cache_"+name, "model", "test-model")
	}
	if v("hits_total") != 3 || v("misses_total") != 2 || v("reused_tokens_total") != float64(st.Reused) || v("off") != 0 {
		t.Fatalf("prefix cache series: hits %v, misses %v, reused %v, off %v", v("hits_total"), v("misses_total"), v("reused_tokens_total"), v("off"))
	}
	if snap["template"].Total() != 5 || snap["tokenize"].Total() != 5 {
		t.Fatalf("template %d, tokenize %d observations, want 5 each", snap["template"].Total(), snap["tokenize"].Total())
	}
}
