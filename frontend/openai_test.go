package frontend

// Tests of the API's contract as the official Go client sees it: what it
// sends by default is accepted, and errors decode into *openai.Error with
// OpenAI's status, type, param and code.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/kvmesh/kvmesh/kv"
)

func newOpenAIClient(t *testing.T, b *fakeBackend) openai.Client {
	t.Helper()
	ts := newTestServer(t, b, DefaultConfig())
	return openai.NewClient(option.WithBaseURL(ts.URL+"/v1"), option.WithAPIKey("k"), option.WithMaxRetries(0))
}

func wantAPIError(t *testing.T, err error, status int, param, code, msg string) {
	t.Helper()
	var ae *openai.Error
	if !errors.As(err, &ae) {
		t.Fatalf("want an *openai.Error, got %v", err)
	}
	if ae.StatusCode != status || ae.Param != param || ae.Code != code || !strings.Contains(ae.Message, msg) {
		t.Fatalf("got %d param %q code %q %q; want %d param %q code %q containing %q", ae.StatusCode, ae.Param, ae.Code, ae.Message, status, param, code, msg)
	}
}

// The no-ops clients send (or may send by default) are accepted, not
// rejected as unsupported.
func TestOpenAIClientNoOpsAccepted(t *testing.T) {
	c := newOpenAIClient(t, &fakeBackend{reply: "fine"})
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{
		Model:             "test-model",
		Messages:          []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		Logprobs:          openai.Bool(false),
		ToolChoice:        openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("none")},
		ResponseFormat:    openai.ChatCompletionNewParamsResponseFormatUnion{OfText: &shared.ResponseFormatTextParam{}},
		ParallelToolCalls: openai.Bool(true),
		Store:             openai.Bool(false),
		Metadata:          shared.Metadata{"team": "qa"},
		ServiceTier:       openai.ChatCompletionNewParamsServiceTierAuto,
		PresencePenalty:   openai.Float(0.5),
		FrequencyPenalty:  openai.Float(-0.5),
		User:              openai.String("u1"),
	}
	resp, err := c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].Message.Content != "fine" {
		t.Fatalf("content %q", resp.Choices[0].Message.Content)
	}
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	st := c.Chat.Completions.NewStreaming(ctx, params)
	var text string
	for st.Next() {
		if ch := st.Current(); len(ch.Choices) > 0 {
			text += ch.Choices[0].Delta.Content
		}
	}
	if err := st.Err(); err != nil || text != "fine" {
		t.Fatalf("stream: %q, %v", text, err)
	}
	// Tool definitions with tool_choice "none" call no tool: accepted.
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{}
	params.Tools = []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "f"})}
	if _, err := c.Chat.Completions.New(ctx, params); err != nil {
		t.Fatalf("tools with tool_choice none: %v", err)
	}
	comp, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: "test-model",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("q")}, BestOf: openai.Int(1), Logprobs: openai.Int(0)})
	if err == nil {
		t.Fatalf("logprobs 0 accepted: %+v", comp)
	}
	wantAPIError(t, err, 400, "logprobs", "unsupported_parameter", "not supported")
}

// What kvmesh cannot do is a precise 400 naming the parameter.
func TestOpenAIClientUnsupported(t *testing.T) {
	b := &fakeBackend{reply: "x"}
	c := newOpenAIClient(t, b)
	ctx := context.Background()
	base := func() openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{Model: "test-model", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}
	}
	cases := []struct {
		set               func(*openai.ChatCompletionNewParams)
		param, code, want string
	}{
		{func(p *openai.ChatCompletionNewParams) { p.Logprobs = openai.Bool(true) }, "logprobs", "unsupported_parameter", "not supported"},
		{func(p *openai.ChatCompletionNewParams) {
			p.Tools = []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "f"})}
		}, "tools", "unsupported_parameter", "not supported"},
		{func(p *openai.ChatCompletionNewParams) {
			p.ResponseFormat = openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONObject: &shared.ResponseFormatJSONObjectParam{}}
		}, "response_format", "unsupported_parameter", "json_object"},
		{func(p *openai.ChatCompletionNewParams) { p.PresencePenalty = openai.Float(2.5) }, "presence_penalty", "", "between -2 and 2"},
		{func(p *openai.ChatCompletionNewParams) { p.TopLogprobs = openai.Int(21) }, "top_logprobs", "", "between 0 and 20"},
		{func(p *openai.ChatCompletionNewParams) {
			p.Messages = append(p.Messages, openai.ToolMessage("42", ""))
		}, "messages[1].tool_call_id", "", "tool_call_id"},
	}
	for i, tc := range cases {
		p := base()
		tc.set(&p)
		_, err := c.Chat.Completions.New(ctx, p)
		t.Run(fmt.Sprint(i, tc.param), func(t *testing.T) { wantAPIError(t, err, 400, tc.param, tc.code, tc.want) })
	}
	if len(b.requests) != 0 {
		t.Fatalf("%d rejected requests reached the backend", len(b.requests))
	}
}

// Model retrieval: OpenAI's Model object, or its 404 for an unknown id.
func TestOpenAIClientModelRetrieve(t *testing.T) {
	c := newOpenAIClient(t, &fakeBackend{maxContext: 512})
	m, err := c.Models.Get(context.Background(), "test-model")
	if err != nil {
		t.Fatal(err)
	}
	if m.ID != "test-model" || m.Object != "model" || m.OwnedBy != "kvmesh" || m.Created != 1 {
		t.Fatalf("model %+v", m)
	}
	if got := m.JSON.ExtraFields["max_model_len"].Raw(); got != "512" {
		t.Fatalf("max_model_len %q, want 512", got)
	}
	_, err = c.Models.Get(context.Background(), "org/no-such-model")
	wantAPIError(t, err, 404, "model", "model_not_found", "'org/no-such-model' does not exist")
}

// A request its workers cannot hold is a 400 context_length_exceeded
// before it reaches them, naming the parameter to shorten.
func TestContextLengthExceeded(t *testing.T) {
	b := &fakeBackend{reply: strings.Repeat("y", 200), maxContext: 64}
	c := newOpenAIClient(t, b)
	ctx := context.Background()
	chat := func(content string, maxTokens int64) error {
		p := openai.ChatCompletionNewParams{Model: "test-model", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(content)}}
		if maxTokens > 0 {
			p.MaxTokens = openai.Int(maxTokens)
		}
		_, err := c.Chat.Completions.New(ctx, p)
		return err
	}
	prompt := len("<user>hi<assistant>") // 19 tokens
	wantAPIError(t, chat("hi", 1000000000), 400, "max_tokens", "context_length_exceeded",
		fmt.Sprintf("This model's maximum context length is 64 tokens. However, you requested %d tokens (%d in the messages, 1000000000 in the completion).", prompt+1000000000, prompt))
	wantAPIError(t, chat(strings.Repeat("w", 100), 0), 400, "messages", "context_length_exceeded", "your messages resulted in 117 tokens")
	_, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: "test-model",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("abc")}, MaxTokens: openai.Int(62)})
	wantAPIError(t, err, 400, "max_tokens", "context_length_exceeded", "(3 in the prompt, 62 in the completion)")
	if len(b.requests) != 0 {
		t.Fatalf("%d requests over the context reached the backend", len(b.requests))
	}
	// Without max_tokens the completion stops where the context ends.
	resp, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "test-model", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].FinishReason != "length" || resp.Usage.CompletionTokens != int64(64-prompt) {
		t.Fatalf("finish %q after %d tokens, want length after %d", resp.Choices[0].FinishReason, resp.Usage.CompletionTokens, 64-prompt)
	}
}

// A worker's rejection (gRPC InvalidArgument: kv.ErrRejected) is the client's
// mistake: 400, and the request is not migrated to another worker.
func TestWorkerRejectionIs400NotMigrated(t *testing.T) {
	b := &fakeBackend{reply: "x", recvErr: fmt.Errorf("%w: generate: need 9 KV blocks, the engine has 8", kv.ErrRejected)}
	c := newOpenAIClient(t, b)
	_, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "test-model",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	wantAPIError(t, err, 400, "", "", "the worker rejected the request: generate: need 9 KV blocks")
	if len(b.requests) != 1 {
		t.Fatalf("%d attempts, want 1 (no migration)", len(b.requests))
	}
}
