package frontend

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newTestServer(t *testing.T, b *fakeBackend, cfg Config) *httptest.Server {
	t.Helper()
	reg := prometheus.NewRegistry()
	s := New(cfg, b, models{testModel()}, reg, reg)
	s.rng = func() uint64 { return 7 }
	ts := httptest.NewServer(s)
	t.Cleanup(func() { ts.Close(); http.DefaultClient.CloseIdleConnections() })
	return ts
}

func post(t *testing.T, url, body string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// sseEvents reads a stream into its data payloads (without [DONE]) and
// reports whether [DONE] closed it.
func sseEvents(t *testing.T, r io.Reader) (events []map[string]any, done bool) {
	t.Helper()
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		data := strings.TrimPrefix(line, "data: ")
		if data == "[DONE]" {
			done = true
			continue
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("bad event %q: %v", data, err)
		}
		events = append(events, ev)
	}
	return events, done
}

func chatDeltas(events []map[string]any) (text string, finish any) {
	for _, ev := range events {
		ch, _ := ev["choices"].([]any)
		for _, c := range ch {
			cm := c.(map[string]any)
			if d, ok := cm["delta"].(map[string]any); ok {
				if s, ok := d["content"].(string); ok {
					text += s
				}
			}
			if t, ok := cm["text"].(string); ok {
				text += t
			}
			if cm["finish_reason"] != nil {
				finish = cm["finish_reason"]
			}
		}
	}
	return
}

func TestChatNonStreaming(t *testing.T) {
	b := &fakeBackend{reply: "Hello, world!"}
	ts := newTestServer(t, b, DefaultConfig())
	resp, body := post(t, ts.URL+"/v1/chat/completions", `{"model":"test-model","messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var out struct {
		Object  string
		Choices []struct {
			Message      struct{ Role, Content string }
			FinishReason string `json:"finish_reason"`
		}
		Usage struct {
			PromptTokens, CompletionTokens, TotalTokens int `json:"-"`
		}
	}
	json.Unmarshal([]byte(body), &out)
	var usage map[string]any
	var raw map[string]json.RawMessage
	json.Unmarshal([]byte(body), &raw)
	json.Unmarshal(raw["usage"], &usage)
	if out.Object != "chat.completion" || out.Choices[0].Message.Content != "Hello, world!" || out.Choices[0].FinishReason != "stop" || out.Choices[0].Message.Role != "assistant" {
		t.Fatalf("unexpected answer: %s", body)
	}
	prompt := len("<user>hi<assistant>")
	// 13 reply tokens + EOS.
	if usage["prompt_tokens"] != float64(prompt) || usage["completion_tokens"] != float64(14) || usage["total_tokens"] != float64(prompt+14) {
		t.Fatalf("usage %v", usage)
	}
	if usage["prompt_tokens_details"].(map[string]any)["cached_tokens"] != float64(3) {
		t.Fatalf("cached tokens: %v", usage)
	}
	if b.requests[0].Seed != 7 {
		t.Fatalf("a request without a seed gets a random one; got %d", b.requests[0].Seed)
	}
}

func TestChatStreamingWithUsage(t *testing.T) {
	b := &fakeBackend{reply: "héllo 世界 🙂!"}
	ts := newTestServer(t, b, DefaultConfig())
	resp, err := http.Post(ts.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"test-model","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"seed":5}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	events, done := sseEvents(t, resp.Body)
	if !done {
		t.Fatal("stream did not end with [DONE]")
	}
	text, finish := chatDeltas(events)
	if text != b.reply || finish != "stop" {
		t.Fatalf("text %q finish %v", text, finish)
	}
	for _, ev := range events[:len(events)-1] {
		if u, ok := ev["usage"]; !ok || u != nil {
			t.Fatalf("with include_usage every chunk carries usage:null, got %v", ev)
		}
		_, content := ev["choices"].([]any)[0].(map[string]any)["delta"].(map[string]any)["content"].(string)
		if !content && ev["choices"].([]any)[0].(map[string]any)["finish_reason"] == nil {
			t.Fatalf("chunk without content: %v", ev)
		}
	}
	last := events[len(events)-1]
	if len(last["choices"].([]any)) != 0 || last["usage"].(map[string]any)["completion_tokens"] != float64(len(b.reply)+1) {
		t.Fatalf("final usage chunk %v", last)
	}
	if b.requests[0].Seed != 5 {
		t.Fatal("seed not passed to the backend")
	}
}

func TestCompletions(t *testing.T) {
	b := &fakeBackend{reply: "abcdefgh"}
	ts := newTestServer(t, b, DefaultConfig())
	for _, prompt := range []string{`"say"`, `["say"]`, `[115, 97, 121]`, `[[115, 97, 121]]`} {
		resp, body := post(t, ts.URL+"/v1/completions", `{"model":"test-model","prompt":`+prompt+`,"max_tokens":5}`)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", prompt, resp.StatusCode, body)
		}
		var out map[string]any
		json.Unmarshal([]byte(body), &out)
		c := out["choices"].([]any)[0].(map[string]any)
		if out["object"] != "text_completion" || c["text"] != "abcde" || c["finish_reason"] != "length" {
			t.Fatalf("%s: %s", prompt, body)
		}
		if u := out["usage"].(map[string]any); u["prompt_tokens"] != float64(3) || u["completion_tokens"] != float64(5) {
			t.Fatalf("%s: usage %v", prompt, u)
		}
	}
	// Two prompts: two choices.
	_, body := post(t, ts.URL+"/v1/completions", `{"model":"test-model","prompt":["a","b"],"max_tokens":2}`)
	var out map[string]any
	json.Unmarshal([]byte(body), &out)
	if len(out["choices"].([]any)) != 2 {
		t.Fatalf("two prompts: %s", body)
	}
	// Streaming.
	resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"test-model","prompt":"x","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	events, done := sseEvents(t, resp.Body)
	resp.Body.Close()
	if text, finish := chatDeltas(events); !done || text != "abcdefgh" || finish != "stop" {
		t.Fatalf("stream: %q %v %v", text, finish, done)
	}
}

func TestStopSequences(t *testing.T) {
	cases := []struct {
		reply, stop, want string
	}{
		{"Hello, world! Bye.", `"world"`, "Hello, "},
		{"Hello, world! Bye.", `["zzz","!"]`, "Hello, world"},
		{"naïve café 🙂 end", `"🙂"`, "naïve café "},
		{"naïve café 🙂 end", `"é 🙂"`, "naïve caf"},
		{"no match here", `["xyz"]`, "no match here"},
		{"partial stop at the en", `"end"`, "partial stop at the en"},
	}
	for _, c := range cases {
		for _, stream := range []bool{false, true} {
			b := &fakeBackend{reply: c.reply}
			ts := newTestServer(t, b, DefaultConfig())
			body := fmt.Sprintf(`{"model":"test-model","messages":[{"role":"user","content":"x"}],"stop":%s,"stream":%v}`, c.stop, stream)
			resp, err := http.Post(ts.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			var text string
			var finish any
			if stream {
				events, _ := sseEvents(t, resp.Body)
				text, finish = chatDeltas(events)
			} else {
				var out map[string]any
				json.NewDecoder(resp.Body).Decode(&out)
				ch := out["choices"].([]any)[0].(map[string]any)
				text, finish = ch["message"].(map[string]any)["content"].(string), ch["finish_reason"]
			}
			resp.Body.Close()
			if text != c.want || finish != "stop" {
				t.Errorf("reply %q stop %s stream %v: got %q (%v), want %q", c.reply, c.stop, stream, text, finish, c.want)
			}
		}
	}
}

func TestBadRequests(t *testing.T) {
	b := &fakeBackend{reply: "x"}
	cfg := DefaultConfig()
	cfg.MaxBodyBytes = 4096
	ts := newTestServer(t, b, cfg)
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	cases := []struct {
		path, body string
		status     int
		param      string
		msg        string
	}{
		{"chat/completions", `{"model":`, 400, "", "malformed JSON"},
		{"chat/completions", `[1,2]`, 400, "", "must be a JSON object"},
		{"chat/completions", ``, 400, "", "body is empty"},
		{"chat/completions", `{"model":"test-model"} {}`, 400, "", "unexpected data"},
		{"chat/completions", `{` + msgs + `}`, 400, "model", "'model' is required"},
		{"chat/completions", `{"model":5,` + msgs + `}`, 400, "model", "'model' must be a string, got a number"},
		{"chat/completions", `{"model":"nope",` + msgs + `}`, 404, "model", "'nope' does not exist"},
		{"chat/completions", `{"model":"test-model"}`, 400, "messages", "'messages' is required"},
		{"chat/completions", `{"model":"test-model","messages":{}}`, 400, "messages", "must be an array"},
		{"chat/completions", `{"model":"test-model","messages":[]}`, 400, "messages", "at least one"},
		{"chat/completions", `{"model":"test-model","messages":[{"role":"wizard","content":"x"}]}`, 400, "messages[0].role", `got "wizard"`},
		{"chat/completions", `{"model":"test-model","messages":[{"content":"x"}]}`, 400, "messages[0].role", "is required"},
		{"chat/completions", `{"model":"test-model","messages":[{"role":"user"}]}`, 400, "messages[0].content", "is required"},
		{"chat/completions", `{"model":"test-model","messages":[{"role":"user","content":7}]}`, 400, "messages[0].content", "string or an array"},
		{"chat/completions", `{"model":"test-model","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "messages[0].content[0].type", "not supported"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"temperature":3}`, 400, "temperature", "between 0 and 2"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"temperature":"hot"}`, 400, "temperature", "must be a number"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"top_p":0}`, 400, "top_p", "greater than 0"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"max_tokens":0}`, 400, "max_tokens", "between 1"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"max_completion_tokens":1.5}`, 400, "max_completion_tokens", "must be an integer"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"n":2}`, 400, "n", "'n' must be 1"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"stop":["a","b","c","d","e"]}`, 400, "stop", "at most 4"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"stop":[1]}`, 400, "stop", "'stop[0]' must be a string"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"stream":"yes"}`, 400, "stream", "must be a boolean"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"stream_options":{"include_usage":true}}`, 400, "stream_options", "only allowed when 'stream' is true"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"stream":true,"stream_options":{"include_usage":1}}`, 400, "stream_options.include_usage", "must be a boolean"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"seed":"x"}`, 400, "seed", "must be an integer"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"pad":"` + strings.Repeat("x", 5000) + `"}`, 413, "", "exceeds the limit"},
		{"completions", `{"model":"test-model"}`, 400, "prompt", "'prompt' is required"},
		{"completions", `{"model":"test-model","prompt":{}}`, 400, "prompt", "must be a string"},
		{"completions", `{"model":"test-model","prompt":[]}`, 400, "prompt", "empty array"},
		{"completions", `{"model":"test-model","prompt":[1,-1]}`, 400, "prompt", "'prompt[1]' must be a token id"},
		{"completions", `{"model":"test-model","prompt":["a",1]}`, 400, "prompt", "'prompt[1]' must be a string"},
		{"completions", `{"model":"test-model","prompt":""}`, 400, "prompt", "empty after tokenization"},
		{"completions", `{"model":"test-model","prompt":["a","b"],"stream":true}`, 400, "prompt", "single prompt"},
	}
	for _, c := range cases {
		resp, body := post(t, ts.URL+"/v1/"+c.path, c.body)
		var e struct {
			Error struct {
				Message string
				Type    string
				Param   *string
			}
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil {
			t.Errorf("%s: not a JSON error: %q", c.body, body)
			continue
		}
		param := ""
		if e.Error.Param != nil {
			param = *e.Error.Param
		}
		if resp.StatusCode != c.status || param != c.param || !strings.Contains(e.Error.Message, c.msg) {
			t.Errorf("%.80s: got %d param %q %q; want %d param %q containing %q", c.body, resp.StatusCode, param, e.Error.Message, c.status, c.param, c.msg)
		}
	}
	if len(b.requests) != 0 {
		t.Fatalf("bad requests reached the backend: %d", len(b.requests))
	}
	// Wrong method and unknown route.
	resp, err := http.Get(ts.URL + "/v1/chat/completions")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 && resp.StatusCode != 405 {
		t.Fatalf("GET chat: %d", resp.StatusCode)
	}
}

func TestBusyIs503WithRetryAfter(t *testing.T) {
	b := &fakeBackend{err: &BusyError{RetryAfter: 2 * time.Second}}
	ts := newTestServer(t, b, DefaultConfig())
	resp, body := post(t, ts.URL+"/v1/chat/completions", `{"model":"test-model","messages":[{"role":"user","content":"hi"}],"stream":true}`)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "2" || !strings.Contains(body, "busy") {
		t.Fatalf("%d %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
}

func TestMigrationKeepsOneStream(t *testing.T) {
	b := &fakeBackend{reply: "The quick brown fox jumps.", dieAfter: map[int]int{0: 4, 1: 6}}
	ts := newTestServer(t, b, DefaultConfig())
	resp, err := http.Post(ts.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"test-model","messages":[{"role":"user","content":"q"}],"stream":true,"max_tokens":20}`))
	if err != nil {
		t.Fatal(err)
	}
	events, done := sseEvents(t, resp.Body)
	resp.Body.Close()
	text, finish := chatDeltas(events)
	if !done || text != b.reply[:20] || finish != "length" {
		t.Fatalf("migrated stream: %q %v done=%v", text, finish, done)
	}
	if len(b.requests) != 3 {
		t.Fatalf("want 3 attempts, got %d", len(b.requests))
	}
	// Each retry carries the prompt plus what was generated, and the rest of the budget.
	p := len(b.requests[0].Tokens)
	if len(b.requests[1].Tokens) != p+4 || b.requests[1].MaxTokens != 16 || len(b.requests[2].Tokens) != p+10 || b.requests[2].MaxTokens != 10 {
		t.Fatalf("retries: %d/%d, %d/%d", len(b.requests[1].Tokens), b.requests[1].MaxTokens, len(b.requests[2].Tokens), b.requests[2].MaxTokens)
	}
}

func TestMigrationLimitSpent(t *testing.T) {
	b := &fakeBackend{reply: "abcdefghij", dieAfter: map[int]int{0: 2, 1: 2}}
	cfg := DefaultConfig()
	cfg.MigrationLimit = 1
	ts := newTestServer(t, b, cfg)
	resp, err := http.Post(ts.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"test-model","messages":[{"role":"user","content":"q"}],"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	events, done := sseEvents(t, resp.Body)
	resp.Body.Close()
	last := events[len(events)-1]
	if !done || last["error"] == nil || !strings.Contains(fmt.Sprint(last["error"]), "migration limit (1)") {
		t.Fatalf("want an in-stream error, got %v (done=%v)", last, done)
	}
	// Non-streaming: a plain 503.
	b2 := &fakeBackend{reply: "abcdefghij", dieAfter: map[int]int{0: 2, 1: 2}}
	ts2 := newTestServer(t, b2, cfg)
	r2, body := post(t, ts2.URL+"/v1/chat/completions", `{"model":"test-model","messages":[{"role":"user","content":"q"}]}`)
	if r2.StatusCode != 503 {
		t.Fatalf("non-streaming: %d %s", r2.StatusCode, body)
	}
}

func TestClientDisconnectCancelsWork(t *testing.T) {
	b := &fakeBackend{reply: strings.Repeat("z", 1000), delay: 5 * time.Millisecond, started: make(chan struct{}), cancelled: make(chan struct{})}
	ts := newTestServer(t, b, DefaultConfig())
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"test-model","messages":[{"role":"user","content":"q"}],"stream":true,"max_tokens":1000}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	<-b.started
	buf := make([]byte, 64)
	resp.Body.Read(buf)
	cancel()
	resp.Body.Close()
	select {
	case <-b.cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("client disconnect did not cancel the backend stream")
	}
}

func TestRoutingInjectionIgnored(t *testing.T) {
	b := &fakeBackend{reply: "ok"}
	ts := newTestServer(t, b, DefaultConfig())
	plain := `{"model":"test-model","messages":[{"role":"user","content":"hi"}],"seed":1}`
	injected := `{"model":"test-model","messages":[{"role":"user","content":"hi"}],"seed":1,
	  "kv_hint":{"protocol_version":"0.1","message_id":"m","actions":[]},
	  "kv_transfer_params":{"do_remote_prefill":true,"remote_host":"10.0.0.1"},
	  "nvext":{"backend_instance_id":3},"kv_hints":{"a":1}}`
	post(t, ts.URL+"/v1/chat/completions", plain)
	req, _ := http.NewRequest("POST", ts.URL+"/v1/chat/completions", strings.NewReader(injected))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-dynamo-worker-instance-id", "3")
	req.Header.Set("x-kvmesh-worker", "3")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(b.requests) != 2 {
		t.Fatalf("%d requests", len(b.requests))
	}
	a, c := b.requests[0], b.requests[1]
	a.RequestID, c.RequestID = "", ""
	if !reflect.DeepEqual(a, c) {
		t.Fatalf("injected routing fields changed what the router sees:\n%+v\n%+v", a, c)
	}
}

func TestModelsHealthMetrics(t *testing.T) {
	b := &fakeBackend{reply: "ok"}
	ts := newTestServer(t, b, DefaultConfig())
	resp, err := http.Get(ts.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Object string
		Data   []struct{ ID, Object string }
	}
	json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if out.Object != "list" || len(out.Data) != 1 || out.Data[0].ID != "test-model" || out.Data[0].Object != "model" {
		t.Fatalf("models: %+v", out)
	}
	for _, p := range []string{"/health", "/live"} {
		r, err := http.Get(ts.URL + p)
		if err != nil || r.StatusCode != 200 {
			t.Fatalf("%s: %v %v", p, err, r.StatusCode)
		}
		r.Body.Close()
	}
	post(t, ts.URL+"/v1/chat/completions", `{"model":"test-model","messages":[{"role":"user","content":"hi"}]}`)
	_, _ = post(t, ts.URL+"/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`)
	r, err := http.Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(r.Body)
	r.Body.Close()
	for _, want := range []string{
		`kvmesh_frontend_requests_total{endpoint="chat",model="test-model",status="200"} 1`,
		`kvmesh_frontend_requests_total{endpoint="chat",model="unknown",status="404"} 1`,
		`kvmesh_frontend_time_to_first_token_seconds_count{model="test-model"} 1`,
	} {
		if !strings.Contains(string(mb), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestBuiltinModel(t *testing.T) {
	m, err := BuiltinModel("kvmesh-sim")
	if err != nil {
		t.Fatal(err)
	}
	ids, err := m.EncodeChat([]Message{{Role: "user", Content: "Hello there"}})
	if err != nil {
		t.Fatal(err)
	}
	d := m.NewDetokenizer()
	var text string
	for _, id := range ids {
		text += d.Add(id)
	}
	text += d.Flush()
	// Special tokens are skipped when detokenizing; the words survive.
	if !strings.Contains(text, "Hello there") || len(m.EOS) != 2 {
		t.Fatalf("round trip %q, eos %v", text, m.EOS)
	}
	if got := m.Encode("<|im_end|>"); len(got) < 2 {
		t.Fatalf("plain prompts must not produce special tokens: %v", got)
	}
}
