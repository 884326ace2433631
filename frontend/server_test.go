package frontend

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
)

func TestMain(m *testing.M) {
	flag.Parse()
	// A body kept past its handler reads as zeros in the tests; benchmarks
	// time the real path.
	poisonReleasedBodies = flag.Lookup("test.bench").Value.String() == ""
	goleak.VerifyTestMain(m)
}

func newTestServer(t *testing.T, b *fakeBackend, cfg Config) *httptest.Server {
	t.Helper()
	reg := prometheus.NewRegistry()
	return newTestServerFor(t, New(cfg, b, models{testModel()}, reg, reg))
}

// newTestServerFor serves s with a fixed seed source.
func newTestServerFor(t *testing.T, s *Server) *httptest.Server {
	t.Helper()
	s.rng = func() uint64 { return 7 }
	ts := httptest.NewServer(s)
	t.Cleanup(func() { ts.Close(); http.DefaultClient.CloseIdleConnections() })
	return ts
}

// The OpenAI client-side helpers shared with the other packages' tests.
var (
	post       = testutil.Post
	sseEvents  = testutil.SSEEvents
	chatDeltas = testutil.ChatDeltas
)

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
		{"chat/completions", `{"model":"test-model",` + msgs + `}}`, 400, "", "unexpected data"},
		{"chat/completions", `{` + msgs + `}`, 400, "model", "'model' is required"},
		{"chat/completions", `{"model":5,` + msgs + `}`, 400, "model", "Invalid type for 'model': expected a string, but got a number instead."},
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
		{"chat/completions", `{"model":"test-model",` + msgs + `,"temperature":"hot"}`, 400, "temperature", "Invalid type for 'temperature': expected a number, but got a string instead."},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"top_p":0}`, 400, "top_p", "greater than 0"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"max_tokens":0}`, 400, "max_tokens", "between 1"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"max_completion_tokens":1.5}`, 400, "max_completion_tokens", "expected an integer, but got a decimal number (1.5)"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"n":2}`, 400, "n", "'n' must be 1"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"stop":["a","b","c","d","e"]}`, 400, "stop", "at most 4"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"stop":[1]}`, 400, "stop", "'stop[0]' must be a string"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"stream":"yes"}`, 400, "stream", "Invalid type for 'stream': expected a boolean, but got a string instead."},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"stream_options":{"include_usage":true}}`, 400, "stream_options", "only allowed when 'stream' is true"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"stream":true,"stream_options":{"include_usage":1}}`, 400, "stream_options.include_usage", "expected a boolean, but got a number"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"seed":"x"}`, 400, "seed", "Invalid type for 'seed': expected an integer, but got a string instead."},
		// Numbers in strings are strings, for every numeric parameter.
		{"chat/completions", `{"model":"test-model",` + msgs + `,"max_tokens":"4"}`, 400, "max_tokens", "Invalid type for 'max_tokens': expected an integer, but got a string instead."},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"seed":"4"}`, 400, "seed", "expected an integer, but got a string"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"n":"1"}`, 400, "n", "expected an integer, but got a string"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"temperature":"1"}`, 400, "temperature", "expected a number, but got a string"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"top_p":"0.5"}`, 400, "top_p", "expected a number, but got a string"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"stream":"true"}`, 400, "stream", "expected a boolean, but got a string"},
		{"completions", `{"model":"test-model","prompt":[1,"2"]}`, 400, "prompt", "'prompt[1]' must be a token id (an integer), got a string"},
		// Out of range is said as such, not "not an integer".
		{"chat/completions", `{"model":"test-model",` + msgs + `,"max_tokens":9223372036854775808}`, 400, "max_tokens", "'max_tokens' must be between 1 and 2147483647, got 9223372036854775808"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"max_tokens":4294967296}`, 400, "max_tokens", "must be between 1 and 2147483647, got 4294967296"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"seed":1e30}`, 400, "seed", "must be between"},
		// Parameters validated as OpenAI documents them.
		{"chat/completions", `{"model":"test-model",` + msgs + `,"presence_penalty":5}`, 400, "presence_penalty", "'presence_penalty' must be between -2 and 2, got 5"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"frequency_penalty":"x"}`, 400, "frequency_penalty", "Invalid type for 'frequency_penalty': expected a number"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"logprobs":"x"}`, 400, "logprobs", "Invalid type for 'logprobs': expected a boolean"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"logprobs":true}`, 400, "logprobs", "'logprobs': true is not supported"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"top_logprobs":30}`, 400, "top_logprobs", "must be between 0 and 20, got 30"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"top_logprobs":2}`, 400, "top_logprobs", "requires 'logprobs' to be true"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"logit_bias":{"50256":-100}}`, 400, "logit_bias", "'logit_bias' is not supported"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"logit_bias":{"x":1}}`, 400, "logit_bias", "keys must be token ids"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"logit_bias":{"1":101}}`, 400, "logit_bias", "between -100 and 100"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"tools":[{"type":"function","function":{"name":"f"}}]}`, 400, "tools", `'tools' with 'tool_choice' "auto" is not supported`},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"f"}}}`, 400, "tools", "naming a tool is not supported"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"tool_choice":"required"}`, 400, "tool_choice", "only allowed when 'tools' are specified"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"tool_choice":"sometimes"}`, 400, "tool_choice", "must be"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"tools":{}}`, 400, "tools", "expected an array"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"functions":[{"name":"f"}]}`, 400, "functions", "not supported"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"response_format":{"type":"json_object"}}`, 400, "response_format", "'response_format' of type 'json_object' is not supported"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"response_format":{"type":"json_schema","json_schema":{"name":"x"}}}`, 400, "response_format", "not supported"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"response_format":{"type":"yaml"}}`, 400, "response_format.type", "must be one of"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"response_format":"text"}`, 400, "response_format", "expected an object"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"modalities":["text","audio"]}`, 400, "modalities", "not supported"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"reasoning_effort":"high"}`, 400, "reasoning_effort", "not supported"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"store":"yes"}`, 400, "store", "expected a boolean"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"metadata":[]}`, 400, "metadata", "expected an object"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"max_tokens":4,"min_tokens":8}`, 400, "min_tokens", "'min_tokens' (8) must not exceed 'max_tokens' (4)"},
		{"chat/completions", `{"model":"test-model",` + msgs + `,"ignore_eos":1}`, 400, "ignore_eos", "expected a boolean"},
		{"completions", `{"model":"test-model","prompt":"a","best_of":2}`, 400, "best_of", "'best_of' 2 is not supported"},
		{"completions", `{"model":"test-model","prompt":"a","best_of":0}`, 400, "best_of", "between 1 and 20"},
		{"completions", `{"model":"test-model","prompt":"a","logprobs":2}`, 400, "logprobs", "not supported"},
		{"completions", `{"model":"test-model","prompt":"a","logprobs":9}`, 400, "logprobs", "between 0 and 5"},
		{"completions", `{"model":"test-model","prompt":"a","suffix":"z"}`, 400, "suffix", "not supported"},
		{"chat/completions", `{"model":"test-model","messages":[{"role":"tool","content":"42"}]}`, 400, "messages[0].tool_call_id", "Missing parameter 'tool_call_id'"},
		{"completions", `{"model":"test-model","prompt":[1000000000]}`, 400, "prompt", "'prompt[0]' is token id 1000000000, outside the model's vocabulary of 257 tokens"},
		{"completions", `{"model":"test-model","prompt":[[1],[2,257]]}`, 400, "prompt", "'prompt[1][1]' is token id 257"},
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
	b := &fakeBackend{err: &kv.BusyError{RetryAfter: 2 * time.Second}}
	ts := newTestServer(t, b, DefaultConfig())
	resp, body := post(t, ts.URL+"/v1/chat/completions", `{"model":"test-model","messages":[{"role":"user","content":"hi"}],"stream":true}`)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "2" || !strings.Contains(body, "busy") {
		t.Fatalf("%d %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
}

func TestQueueFullIs429WithRetryAfter(t *testing.T) {
	b := &fakeBackend{err: &kv.QueueFullError{Model: "test-model", Limit: 4, RetryAfter: 3 * time.Second}}
	ts := newTestServer(t, b, DefaultConfig())
	resp, body := post(t, ts.URL+"/v1/chat/completions", `{"model":"test-model","messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "3" ||
		!strings.Contains(body, `"type":"requests"`) || !strings.Contains(body, `"code":"rate_limit_exceeded"`) {
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
	// The stream would run 20 s; the disconnect must end it well before.
	b := &fakeBackend{reply: strings.Repeat("z", 1000), delay: 20 * time.Millisecond, started: make(chan struct{}), cancelled: make(chan struct{})}
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
	case <-time.After(15 * time.Second):
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

// Requests cut by the server's shutdown (their base context cancelled with
// ErrShuttingDown) answer 503, or an error event and [DONE] in a stream;
// a client that leaves is still a silent 499.
func TestShutdownIs503NotClientGone(t *testing.T) {
	b := &fakeBackend{reply: strings.Repeat("z", 1000), delay: 2 * time.Millisecond}
	reg := prometheus.NewRegistry()
	s := New(DefaultConfig(), b, models{testModel()}, reg, reg)
	base, stop := context.WithCancelCause(context.Background())
	defer stop(nil)
	ts := httptest.NewUnstartedServer(s)
	ts.Config.BaseContext = func(net.Listener) context.Context { return base }
	ts.Start()
	defer func() { ts.Close(); http.DefaultClient.CloseIdleConnections() }()

	type result struct {
		resp *http.Response
		body string
	}
	plain, stream := make(chan result, 1), make(chan result, 1)
	go func() {
		resp, body := post(t, ts.URL+"/v1/chat/completions", `{"model":"test-model","messages":[{"role":"user","content":"q"}],"max_tokens":1000}`)
		plain <- result{resp, body}
	}()
	resp, err := http.Post(ts.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"test-model","messages":[{"role":"user","content":"q"}],"max_tokens":1000,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	// The shutdown must cut the stream mid-way: it waits for a token.
	tokenSeen := make(chan struct{})
	go func() {
		var b []byte
		buf := make([]byte, 4096)
		for seen := false; ; {
			n, err := resp.Body.Read(buf)
			b = append(b, buf[:n]...)
			if !seen && bytes.Contains(b, []byte(`"content":"z`)) {
				seen = true
				close(tokenSeen)
			}
			if err != nil {
				break
			}
		}
		resp.Body.Close()
		stream <- result{resp, string(b)}
	}()
	// A client that leaves before the shutdown.
	cctx, leave := context.WithCancel(context.Background())
	left := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(cctx, "POST", ts.URL+"/v1/chat/completions",
			strings.NewReader(`{"model":"test-model","messages":[{"role":"user","content":"q"}],"max_tokens":1000}`))
		_, err := http.DefaultClient.Do(req)
		left <- err
	}()
	for {
		b.mu.Lock()
		n := len(b.requests)
		b.mu.Unlock()
		if n == 3 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case <-tokenSeen:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream sent no token")
	}
	leave()
	<-left
	for !strings.Contains(fmt.Sprint(requestStatuses(t, reg)), "499") {
		time.Sleep(time.Millisecond)
	}
	stop(ErrShuttingDown)

	r := <-plain
	var e struct{ Error apiError }
	if err := json.Unmarshal([]byte(r.body), &e); err != nil || r.resp.StatusCode != 503 || e.Error.Code == nil ||
		*e.Error.Code != "server_shutting_down" || !strings.Contains(e.Error.Message, "shutting down") {
		t.Fatalf("non-streaming: %d %s", r.resp.StatusCode, r.body)
	}
	sr := <-stream
	events, done := sseEvents(t, strings.NewReader(sr.body))
	last := events[len(events)-1]
	if !done || last["error"] == nil || !strings.Contains(fmt.Sprint(last["error"]), "server_shutting_down") {
		t.Fatalf("stream: want an error event then [DONE], got %v (done=%v)", last, done)
	}
	text, _ := chatDeltas(events)
	if text == "" {
		t.Fatal("the stream was cut before any token: the test did not cut it mid-stream")
	}

	// The client that left is a 499, not a 503.
	if statuses := requestStatuses(t, reg); fmt.Sprint(statuses) != "[200 499 503]" {
		t.Fatalf("statuses %v, want the stream's 200, the leaver's 499 and the plain request's 503", statuses)
	}
}

// requestStatuses lists the status labels of requests_total, in order.
func requestStatuses(t *testing.T, g prometheus.Gatherer) []string {
	t.Helper()
	mf, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range mf {
		if f.GetName() != "kvmesh_frontend_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "status" {
					out = append(out, l.GetValue())
				}
			}
		}
	}
	return out
}

// A client that writes a whole over-limit body before it reads gets the
// 413, not a broken pipe: the answer goes out before the body is read, and
// the body is then read and dropped.
func TestTooLargeBodyAnsweredBeforeReading(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxBodyBytes = 4096
	b := &fakeBackend{reply: "x"}
	ts := newTestServer(t, b, cfg)
	conn, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	const size = 8 << 20 // well past socket buffers and net/http's 256 KiB discard
	head := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", size)
	body := []byte(`{"model":"test-model","pad":"` + strings.Repeat("x", size-31) + `"}`)
	if _, err := conn.Write(append([]byte(head), body...)); err != nil {
		t.Fatalf("writing the body: %v (the server closed the connection before the client could read the 413)", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 413 || !strings.Contains(string(msg), "request body of 8388608 bytes exceeds the limit of 4096 bytes") {
		t.Fatalf("%d %s", resp.StatusCode, msg)
	}
	if len(b.requests) != 0 {
		t.Fatal("an over-limit request reached the backend")
	}
}

// /health: unhealthy with the backend's reason; healthy with warnings when
// something is wrong that does not stop serving.
func TestHealthReasonAndWarnings(t *testing.T) {
	var ready error
	var warnings []string
	ts := newTestServer(t, &fakeBackend{}, Config{MaxBodyBytes: 1 << 20,
		Ready: func() error { return ready }, Warnings: func() []string { return warnings }})
	get := func() (int, string) {
		r, err := http.Get(ts.URL + "/health")
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return r.StatusCode, strings.TrimSpace(string(b))
	}
	if code, body := get(); code != 200 || body != `{"status":"healthy"}` {
		t.Fatalf("%d %s", code, body)
	}
	warnings = []string{"model m has 1 decode workers but no prefill workers; the aggregated workers serve it"}
	if code, body := get(); code != 200 || body != `{"status":"healthy","warnings":["model m has 1 decode workers but no prefill workers; the aggregated workers serve it"]}` {
		t.Fatalf("%d %s", code, body)
	}
	ready = errors.New("model m has 2 prefill workers but no decode workers")
	if code, body := get(); code != 503 || !strings.Contains(body, `"reason":"model m has 2 prefill workers but no decode workers"`) {
		t.Fatalf("%d %s", code, body)
	}
}
