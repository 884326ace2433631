package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvmesh/kvmesh/frontend"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

const simModel = "kvmesh-sim"

func chatParams(content string, seed, maxTokens int64) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:     simModel,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(content)},
		Seed:      openai.Int(seed),
		MaxTokens: openai.Int(maxTokens),
	}
}

// chatStream is what one streamed chat completion delivered.
type chatStream struct {
	text   string
	finish string
	usage  *openai.CompletionUsage
	chunks int // chunks with content
	id     string
}

func streamChat(ctx context.Context, c openai.Client, p openai.ChatCompletionNewParams, opts ...option.RequestOption) (chatStream, error) {
	p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	st := c.Chat.Completions.NewStreaming(ctx, p, opts...)
	defer st.Close()
	var out chatStream
	var b strings.Builder
	first := true
	for st.Next() {
		ch := st.Current()
		if out.id == "" {
			out.id = ch.ID
		} else if ch.ID != out.id {
			return out, fmt.Errorf("chunk id %q, earlier %q", ch.ID, out.id)
		}
		if ch.JSON.Usage.Valid() && ch.Usage.TotalTokens > 0 {
			u := ch.Usage
			out.usage = &u
		}
		for _, c := range ch.Choices {
			if first {
				if c.Delta.Role != "assistant" {
					return out, fmt.Errorf("first chunk's role %q, want assistant", c.Delta.Role)
				}
				first = false
			}
			if c.Delta.Content != "" {
				out.chunks++
				b.WriteString(c.Delta.Content)
			}
			if c.FinishReason != "" {
				out.finish = c.FinishReason
			}
		}
	}
	out.text = b.String()
	return out, st.Err()
}

func chatOnce(t *testing.T, c openai.Client, p openai.ChatCompletionNewParams, opts ...option.RequestOption) *openai.ChatCompletion {
	t.Helper()
	r, err := c.Chat.Completions.New(context.Background(), p, opts...)
	if err != nil {
		t.Fatalf("chat completion: %v", err)
	}
	if len(r.Choices) != 1 {
		t.Fatalf("%d choices, want 1", len(r.Choices))
	}
	return r
}

func checkUsage(t *testing.T, what string, u openai.CompletionUsage, prompt, completion int) {
	t.Helper()
	if int(u.PromptTokens) != prompt || int(u.CompletionTokens) != completion || int(u.TotalTokens) != prompt+completion {
		t.Errorf("%s: usage %d+%d=%d, want %d+%d=%d", what, u.PromptTokens, u.CompletionTokens, u.TotalTokens, prompt, completion, prompt+completion)
	}
}

func apiErr(t *testing.T, err error, status int, param string) *openai.Error {
	t.Helper()
	var e *openai.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T), want an API error with status %d", err, err, status)
	}
	if e.StatusCode != status || e.Param != param {
		t.Errorf("status %d param %q (%s), want %d param %q", e.StatusCode, e.Param, e.Message, status, param)
	}
	if e.Message == "" || e.Type == "" {
		t.Errorf("error without message or type: %+v", e)
	}
	return e
}

// TestServeOpenAI drives `kvmesh serve` with the official OpenAI Go client.
func TestServeOpenAI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvmesh serve")
	}
	s := startServe(t, "--workers", "2", "--speedup-ratio", "10", "--max-body-bytes", "65536")
	client := newClient(s.base)
	ctx := context.Background()
	ws := watchWorkers(t, s.natsURL, simModel, 2)

	t.Run("models", func(t *testing.T) {
		page, err := client.Models.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Data) != 1 || page.Data[0].ID != simModel || page.Data[0].Object != "model" {
			t.Fatalf("models %+v, want exactly %s", page.Data, simModel)
		}
	})

	t.Run("chat", func(t *testing.T) {
		const content, maxTok = "Tell me about KV caches.", 24
		promptLen := len(chatPromptTokens(t, simModel, frontend.Message{Role: "user", Content: content}))
		r := chatOnce(t, client, chatParams(content, 11, maxTok))
		text := r.Choices[0].Message.Content
		if text == "" || r.Choices[0].FinishReason != "length" || r.Object != "chat.completion" || r.Model != simModel {
			t.Fatalf("response %q finish %q object %q model %q", text, r.Choices[0].FinishReason, r.Object, r.Model)
		}
		checkUsage(t, "chat", r.Usage, promptLen, maxTok)

		st, err := streamChat(ctx, client, chatParams(content, 11, maxTok))
		if err != nil {
			t.Fatal(err)
		}
		if st.text != text || st.finish != "length" {
			t.Errorf("stream %q (finish %q), non-stream %q with the same seed", st.text, st.finish, text)
		}
		if st.usage == nil {
			t.Fatal("stream sent no usage chunk with include_usage")
		}
		checkUsage(t, "chat stream", *st.usage, promptLen, maxTok)
		if st.chunks < 2 {
			t.Errorf("%d content chunks for %d tokens: not streamed", st.chunks, maxTok)
		}

		// Seeds: the same seed repeats, another seed differs.
		if again := chatOnce(t, client, chatParams(content, 11, maxTok)).Choices[0].Message.Content; again != text {
			t.Errorf("seed 11 gave %q, then %q", text, again)
		}
		if other := chatOnce(t, client, chatParams(content, 12, maxTok)).Choices[0].Message.Content; other == text {
			t.Errorf("seeds 11 and 12 both gave %q", text)
		}
	})

	t.Run("completions", func(t *testing.T) {
		const prompt, maxTok = "The quick brown fox jumps over", 16
		m, err := frontend.BuiltinModel(simModel)
		if err != nil {
			t.Fatal(err)
		}
		ids := m.Encode(prompt)
		p := openai.CompletionNewParams{Model: simModel, Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
			Seed: openai.Int(5), MaxTokens: openai.Int(maxTok)}
		r, err := client.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Choices) != 1 || r.Choices[0].Text == "" || r.Choices[0].FinishReason != "length" {
			t.Fatalf("choices %+v", r.Choices)
		}
		checkUsage(t, "completion", r.Usage, len(ids), maxTok)

		// The same prompt as token ids is the same request.
		tp := p
		tp.Prompt = openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: toInt64(ids)}
		r2, err := client.Completions.New(ctx, tp)
		if err != nil {
			t.Fatal(err)
		}
		if r2.Choices[0].Text != r.Choices[0].Text {
			t.Errorf("token prompt gave %q, text prompt %q", r2.Choices[0].Text, r.Choices[0].Text)
		}
		checkUsage(t, "token completion", r2.Usage, len(ids), maxTok)

		// Streamed, with usage.
		tp.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		st := client.Completions.NewStreaming(ctx, tp)
		var text strings.Builder
		var finish string
		var u *openai.CompletionUsage
		for st.Next() {
			c := st.Current()
			for _, ch := range c.Choices {
				text.WriteString(ch.Text)
				if ch.FinishReason != "" {
					finish = string(ch.FinishReason)
				}
			}
			if c.Usage.TotalTokens > 0 {
				uu := c.Usage
				u = &uu
			}
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		st.Close()
		if text.String() != r.Choices[0].Text || finish != "length" || u == nil {
			t.Fatalf("streamed %q finish %q usage %v; want %q length", text.String(), finish, u, r.Choices[0].Text)
		}
		checkUsage(t, "streamed completion", *u, len(ids), maxTok)
	})

	t.Run("stop", func(t *testing.T) {
		const content, maxTok = "Write a long story.", 40
		full := chatOnce(t, client, chatParams(content, 21, maxTok)).Choices[0].Message.Content
		stop := pickStop(full)
		if stop == "" {
			t.Fatalf("no usable stop sequence in %q", full)
		}
		want := full[:strings.Index(full, stop)]
		p := chatParams(content, 21, maxTok)
		p.Stop = openai.ChatCompletionNewParamsStopUnion{OfString: openai.String(stop)}
		r := chatOnce(t, client, p)
		if got := r.Choices[0].Message.Content; got != want || r.Choices[0].FinishReason != "stop" {
			t.Errorf("stop %q: got %q finish %q, want %q finish stop (full %q)", stop, got, r.Choices[0].FinishReason, want, full)
		}
		if r.Usage.CompletionTokens >= maxTok {
			t.Errorf("stop hit, yet %d completion tokens", r.Usage.CompletionTokens)
		}
		st, err := streamChat(ctx, client, p)
		if err != nil {
			t.Fatal(err)
		}
		if st.text != want || st.finish != "stop" {
			t.Errorf("streamed with stop %q: %q finish %q, want %q", stop, st.text, st.finish, want)
		}
	})

	t.Run("errors", func(t *testing.T) {
		// Malformed JSON, raw.
		resp := post(t, s.base+"/chat/completions", strings.NewReader(`{"model": "kvmesh-sim", "messages": [`), -2)
		wantStatus(t, resp, http.StatusBadRequest)

		// Bad parameters through the client: each names its parameter.
		bad := []struct {
			param string
			edit  func(*openai.ChatCompletionNewParams)
		}{
			{"max_tokens", func(p *openai.ChatCompletionNewParams) { p.MaxTokens = openai.Int(-5) }},
			{"temperature", func(p *openai.ChatCompletionNewParams) { p.Temperature = openai.Float(2.5) }},
			{"top_p", func(p *openai.ChatCompletionNewParams) { p.TopP = openai.Float(1.5) }},
			{"n", func(p *openai.ChatCompletionNewParams) { p.N = openai.Int(3) }},
			{"messages", func(p *openai.ChatCompletionNewParams) { p.Messages = []openai.ChatCompletionMessageParamUnion{} }},
			{"stop", func(p *openai.ChatCompletionNewParams) {
				p.Stop = openai.ChatCompletionNewParamsStopUnion{OfStringArray: []string{"a", "b", "c", "d", "e"}}
			}},
		}
		for _, b := range bad {
			p := chatParams("hi", 1, 4)
			b.edit(&p)
			_, err := client.Chat.Completions.New(ctx, p)
			apiErr(t, err, http.StatusBadRequest, b.param)
		}
		_, err := client.Completions.New(ctx, openai.CompletionNewParams{Model: simModel,
			Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: []int64{1, -2}}})
		apiErr(t, err, http.StatusBadRequest, "prompt")

		// Unknown model.
		p := chatParams("hi", 1, 4)
		p.Model = "no-such-model"
		_, err = client.Chat.Completions.New(ctx, p)
		if e := apiErr(t, err, http.StatusNotFound, "model"); e.Code != "model_not_found" {
			t.Errorf("unknown model: code %q", e.Code)
		}

		// Body over --max-body-bytes, declared and chunked.
		big := `{"model":"kvmesh-sim","messages":[{"role":"user","content":"` + strings.Repeat("x", 70000) + `"}]}`
		wantStatus(t, post(t, s.base+"/chat/completions", strings.NewReader(big), int64(len(big))), http.StatusRequestEntityTooLarge)
		wantStatus(t, post(t, s.base+"/chat/completions", strings.NewReader(big), -1), http.StatusRequestEntityTooLarge)
	})

	t.Run("routing hints ignored", func(t *testing.T) {
		p := chatParams("hint test", 31, 16)
		plain := chatOnce(t, client, p).Choices[0].Message.Content
		hinted := chatOnce(t, client, p,
			option.WithJSONSet("kv_hint", map[string]any{"v": 1, "op": "fetch", "source": "tcp://10.0.0.1:1", "blocks": []uint64{1, 2, 3}}),
			option.WithJSONSet("kv_transfer_params", map[string]any{"remote_host": "10.0.0.1", "do_remote_prefill": true}),
			option.WithJSONSet("nvext", map[string]any{"backend_instance_id": 1234}),
		).Choices[0].Message.Content
		if hinted != plain {
			t.Errorf("injected hints changed the output: %q vs %q", hinted, plain)
		}
	})

	t.Run("cancel", func(t *testing.T) {
		testutil.WaitFor(t, 15*time.Second, "idle workers", func() bool { n, _ := ws.running(t); return n == 0 })
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		p := chatParams("never ending", 41, 1_000_000)
		st := client.Chat.Completions.NewStreaming(cctx, p)
		for i := 0; i < 6 && st.Next(); i++ {
		}
		if st.Err() != nil {
			t.Fatal(st.Err())
		}
		if n, _ := ws.running(t); n != 1 {
			t.Fatalf("%d requests on the workers mid-stream, want 1", n)
		}
		cancel()
		st.Close()
		start := time.Now()
		testutil.WaitFor(t, 10*time.Second, "the worker to drop the cancelled request", func() bool { n, _ := ws.running(t); return n == 0 })
		t.Logf("worker idle %v after the client cancelled", time.Since(start).Round(time.Millisecond))
		testutil.WaitFor(t, 10*time.Second, "inflight_requests 0", func() bool {
			v, ok := metric(t, s.base, "kvmesh_frontend_inflight_requests")
			return ok && v == 0
		})
	})

	t.Run("32 concurrent streams", func(t *testing.T) {
		const n, maxTok = 32, 24
		streams := make([]chatStream, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				streams[i], errs[i] = streamChat(ctx, client, chatParams(fmt.Sprintf("stream number %d", i), int64(100+i), maxTok))
			})
		}
		wg.Wait()
		ids := map[string]bool{}
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("stream %d: %v", i, errs[i])
			}
			st := streams[i]
			if st.finish != "length" || st.usage == nil || st.usage.CompletionTokens != maxTok {
				t.Errorf("stream %d: finish %q usage %+v", i, st.finish, st.usage)
			}
			if ids[st.id] {
				t.Errorf("stream %d reuses id %s", i, st.id)
			}
			ids[st.id] = true
			// Each equals the same request run alone.
			want := chatOnce(t, client, chatParams(fmt.Sprintf("stream number %d", i), int64(100+i), maxTok)).Choices[0].Message.Content
			if st.text != want {
				t.Errorf("stream %d under load %q, alone %q", i, st.text, want)
			}
		}
	})

	s.stop(t)
}

// TestServeBusy: with every worker past --busy-kv-usage the frontend
// answers 503 with Retry-After, and serves again once load drops.
func TestServeBusy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvmesh serve")
	}
	s := startServe(t, "--workers", "1", "--blocks", "64", "--block-size", "16", "--busy-kv-usage", "0.2", "--speedup-ratio", "1")
	client := newClient(s.base)
	ctx := context.Background()

	// A ~300-token prompt books ~19 of 64 blocks: past 20 %.
	long := strings.Repeat("cache ", 300)
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	holder := client.Chat.Completions.NewStreaming(hctx, chatParams(long, 1, 600))
	if !holder.Next() {
		t.Fatalf("holder stream: %v", holder.Err())
	}

	const flood = 8
	errs := make([]error, flood)
	var wg sync.WaitGroup
	for i := range flood {
		wg.Go(func() {
			_, errs[i] = client.Chat.Completions.New(ctx, chatParams(fmt.Sprintf("flood %d", i), int64(i), 8))
		})
	}
	wg.Wait()
	for i, err := range errs {
		e := apiErr(t, err, http.StatusServiceUnavailable, "")
		if e.Response == nil {
			t.Fatalf("flood %d: no response", i)
		}
		if ra, err := strconv.Atoi(e.Response.Header.Get("Retry-After")); err != nil || ra < 1 {
			t.Errorf("flood %d: Retry-After %q", i, e.Response.Header.Get("Retry-After"))
		}
	}
	if v, _ := metric(t, s.base, "kvmesh_router_busy_rejections_total"); v < flood {
		t.Errorf("router counted %v busy rejections, want ≥ %d", v, flood)
	}

	cancel()
	holder.Close()
	// Load reports come every second and the booking is freed at once.
	testutil.WaitFor(t, 15*time.Second, "the worker to take requests again", func() bool {
		_, err := client.Chat.Completions.New(ctx, chatParams("after the flood", 2, 4))
		return err == nil
	})
	s.stop(t)
}

// pickStop picks a short piece from the middle of s that starts on a rune
// boundary and is not blank.
func pickStop(s string) string {
	r := []rune(s)
	for i := len(r) / 2; i < len(r)-2; i++ {
		c := string(r[i : i+2])
		if strings.TrimSpace(c) == c && c != "" {
			return c
		}
	}
	return ""
}

func toInt64(ids []uint32) []int64 {
	out := make([]int64, len(ids))
	for i, id := range ids {
		out[i] = int64(id)
	}
	return out
}

// post sends a raw JSON body; size -1 sends it chunked (no Content-Length),
// -2 lets net/http measure it.
func post(t *testing.T, url string, body io.Reader, size int64) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if size != -2 {
		req.ContentLength = size
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func wantStatus(t *testing.T, resp *http.Response, status int) {
	t.Helper()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Errorf("status %d (%s), want %d", resp.StatusCode, b, status)
		return
	}
	if !strings.Contains(string(b), `"invalid_request_error"`) {
		t.Errorf("body %s: not an OpenAI error", b)
	}
}
