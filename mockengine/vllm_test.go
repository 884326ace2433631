package mockengine

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

func TestCompletionTokenIDsAndCachedTokens(t *testing.T) {
	_, url := startVLLM(t, VLLMConfig{})
	prompt := seqTokens(40, 100) // two full blocks of 16 and a tail of 8
	body := map[string]any{"model": testModel, "prompt": prompt, "max_tokens": 5, "seed": 7,
		"return_token_ids": true}
	var outs [][]kv.Token
	for i, wantCached := range []int{0, 32} {
		code, b := post(t, url+"/v1/completions", body, map[string]string{"X-Request-Id": "req-1"})
		if code != http.StatusOK {
			t.Fatalf("status %d: %s", code, b)
		}
		c := decode[completion](t, b)
		ch := c.Choices[0]
		switch {
		case c.ID != "cmpl-req-1" || c.Object != "text_completion" || c.Model != testModel:
			t.Fatalf("request %d: id %q object %q model %q", i, c.ID, c.Object, c.Model)
		case ch.FinishReason != "length" || len(ch.TokenIDs) != 5:
			t.Fatalf("request %d: finish %q, %d token ids", i, ch.FinishReason, len(ch.TokenIDs))
		case !slices.Equal(ch.PromptTokenIDs, prompt):
			t.Fatalf("request %d: prompt_token_ids %v", i, ch.PromptTokenIDs)
		case c.Usage.PromptTokens != 40 || c.Usage.CompletionTokens != 5 || c.Usage.TotalTokens != 45:
			t.Fatalf("request %d: usage %+v", i, c.Usage)
		case c.Usage.PromptTokensDetails == nil || c.Usage.PromptTokensDetails.CachedTokens != wantCached:
			t.Fatalf("request %d: prompt_tokens_details %+v, want cached %d", i, c.Usage.PromptTokensDetails, wantCached)
		case string(c.KVTransferParams) != "null":
			t.Fatalf("request %d: kv_transfer_params %s without a connector", i, c.KVTransferParams)
		}
		outs = append(outs, ch.TokenIDs)
	}
	if !slices.Equal(outs[0], outs[1]) {
		t.Fatalf("same seed, different outputs: %v vs %v", outs[0], outs[1])
	}
	// A cache salt is another namespace: nothing is cached for it yet.
	body["cache_salt"] = "tenant-a"
	_, b := post(t, url+"/v1/completions", body, nil)
	if c := decode[completion](t, b); c.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("salted request hit the unsalted cache: %+v", c.Usage)
	}
}

type cmplChunk struct {
	Object  string `json:"object"`
	Choices []struct {
		FinishReason   *string    `json:"finish_reason"`
		TokenIDs       []kv.Token `json:"token_ids"`
		PromptTokenIDs []kv.Token `json:"prompt_token_ids"`
	} `json:"choices"`
}

func TestCompletionStream(t *testing.T) {
	_, url := startVLLM(t, VLLMConfig{})
	prompt := seqTokens(20, 5)
	code, b := post(t, url+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 6, "stream": true,
		"return_token_ids": true, "stream_options": map[string]any{"include_usage": true}}, nil)
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, b)
	}
	evs := sseEvents(t, b)
	if evs[len(evs)-1] != "[DONE]" {
		t.Fatalf("stream ends with %q", evs[len(evs)-1])
	}
	var got []kv.Token
	var finish string
	for i, e := range evs[:len(evs)-2] {
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(e), &m); err != nil {
			t.Fatal(err)
		}
		if _, ok := m["usage"]; ok {
			t.Fatalf("chunk %d carries usage: %s", i, e)
		}
		chunk := decode[cmplChunk](t, []byte(e))
		c := chunk.Choices[0]
		if (i == 0) != (c.PromptTokenIDs != nil) || (i == 0 && !slices.Equal(c.PromptTokenIDs, prompt)) {
			t.Fatalf("chunk %d prompt_token_ids %v", i, c.PromptTokenIDs)
		}
		if !strings.Contains(e, `"prompt_token_ids":`) || !strings.Contains(e, `"stop_reason":null`) {
			t.Fatalf("chunk %d lacks vLLM's explicit fields: %s", i, e)
		}
		got = append(got, c.TokenIDs...)
		if c.FinishReason != nil {
			finish = *c.FinishReason
		}
	}
	if len(got) != 6 || finish != "length" {
		t.Fatalf("streamed %d tokens, finish %q", len(got), finish)
	}
	u := decode[struct {
		Choices []any `json:"choices"`
		Usage   struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}](t, []byte(evs[len(evs)-2]))
	if u.Choices == nil || len(u.Choices) != 0 || u.Usage.PromptTokens != 20 || u.Usage.CompletionTokens != 6 {
		t.Fatalf("usage chunk %s", evs[len(evs)-2])
	}
}

func TestChatCompletions(t *testing.T) {
	_, url := startVLLM(t, VLLMConfig{})
	msgs := []map[string]string{{"role": "user", "content": "Say hello to the mock engine."}}
	code, b := post(t, url+"/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 4}, nil)
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, b)
	}
	c := decode[struct {
		Object  string `json:"object"`
		Choices []struct {
			Message struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}](t, b)
	if c.Object != "chat.completion" || c.Choices[0].Message.Role != "assistant" || c.Choices[0].FinishReason != "length" ||
		c.Usage.CompletionTokens != 4 {
		t.Fatalf("chat response %s", b)
	}
	code, b = post(t, url+"/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 3, "stream": true}, nil)
	evs := sseEvents(t, b)
	n := len(evs)
	if code != http.StatusOK || n < 3 || !strings.Contains(evs[0], `"role":"assistant"`) ||
		!strings.Contains(evs[0], `"object":"chat.completion.chunk"`) || evs[n-1] != "[DONE]" ||
		!strings.Contains(evs[n-2], `"finish_reason":"length"`) {
		t.Fatalf("chat stream %d: %q", code, evs)
	}
}

func TestBadRequestsAreVLLMShaped(t *testing.T) {
	_, url := startVLLM(t, VLLMConfig{})
	long := seqTokens(9000, 0)
	cases := []struct {
		name   string
		body   any
		status int
		want   string
	}{
		{"not json", "{", 400, "invalid request body"},
		{"no prompt", map[string]any{"max_tokens": 3}, 400, "prompt is required"},
		{"unknown model", map[string]any{"model": "nope", "prompt": "hi"}, 404, "The model `nope` does not exist."},
		{"stream options", map[string]any{"prompt": "hi", "stream_options": map[string]any{"include_usage": true}}, 400, "stream=True"},
		{"max tokens 0", map[string]any{"prompt": "hi", "max_tokens": 0}, 400, "max_tokens must be at least 1"},
		{"min over max", map[string]any{"prompt": "hi", "max_tokens": 2, "min_tokens": 3}, 400, "min_tokens must be less than or equal to max_tokens=2"},
		{"out of vocab", map[string]any{"prompt": []int{1, 1 << 30}}, 400, "out of vocabulary"},
		{"too long", map[string]any{"prompt": long}, 400, "maximum context length is 4096"},
		{"empty salt", map[string]any{"prompt": "hi", "cache_salt": ""}, 400, "cache_salt"},
		{"negative temperature", map[string]any{"prompt": "hi", "temperature": -1}, 400, "temperature"},
		{"bad hint", map[string]any{"prompt": "hi", "kv_hints": map[string]any{"protocol_version": "0.1"}}, 400, "kv_hints"},
	}
	for _, tc := range cases {
		code, b := post(t, url+"/v1/completions", tc.body, nil)
		e := decode[apiErr](t, b)
		if code != tc.status || e.Error.Code != tc.status || !strings.Contains(e.Error.Message, tc.want) {
			t.Errorf("%s: %d %s", tc.name, code, b)
		}
		if want := map[int]string{400: "BadRequestError", 404: "NotFoundError"}[tc.status]; e.Error.Type != want {
			t.Errorf("%s: type %q, want %q", tc.name, e.Error.Type, want)
		}
	}
}

func TestHintsRecorded(t *testing.T) {
	v, url := startVLLM(t, VLLMConfig{})
	env := json.RawMessage(`{"protocol_version":"0.1","message_id":"m-7","actions":[{"action_id":"a1","action_type":"kv.fetch","action_version":"1.0","payload":{"source_control_endpoint":"tcp://10.0.0.7:23280","block_hashes":[11,22,18446744073709551615]}}]}`)
	code, b := post(t, url+"/v1/completions", map[string]any{"prompt": "hello", "max_tokens": 1, "kv_hints": env}, map[string]string{"X-Request-Id": "h1"})
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, b)
	}
	// The bridge form: inside kv_transfer_params (no connector needed).
	post(t, url+"/v1/completions", map[string]any{"prompt": "hello", "max_tokens": 1,
		"kv_transfer_params": map[string]any{"kv_hint": env}}, nil)
	hs := v.Hints()
	if len(hs) != 2 {
		t.Fatalf("%d hints recorded", len(hs))
	}
	h := hs[0]
	if h.Field != "kv_hints" || h.MessageID != "m-7" || h.SourceEndpoint != "tcp://10.0.0.7:23280" ||
		!slices.Equal(h.BlockHashes, []uint64{11, 22, 1<<64 - 1}) || !strings.HasPrefix(h.RequestID, "cmpl-h1-0-") {
		t.Fatalf("hint %+v", h)
	}
	if hs[1].Field != "kv_transfer_params.kv_hint" {
		t.Fatalf("bridge hint %+v", hs[1])
	}
	_, b = get(t, url+"/debug/kv_hints")
	var dbg struct {
		Hints []HintRecord `json:"hints"`
	}
	if err := json.Unmarshal(b, &dbg); err != nil || len(dbg.Hints) != 2 || dbg.Hints[0].BlockHashes[2] != 1<<64-1 {
		t.Fatalf("/debug/kv_hints %s (%v)", b, err)
	}
}

func TestModelsHealthVersionMetrics(t *testing.T) {
	v, url := startVLLM(t, VLLMConfig{})
	_, b := get(t, url+"/v1/models")
	m := decode[struct {
		Data []struct {
			ID          string `json:"id"`
			OwnedBy     string `json:"owned_by"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}](t, b)
	if len(m.Data) != 1 || m.Data[0].ID != testModel || m.Data[0].OwnedBy != "vllm" || m.Data[0].MaxModelLen != 4096 {
		t.Fatalf("/v1/models %s", b)
	}
	if code, _ := get(t, url+"/health"); code != 200 {
		t.Fatalf("/health %d", code)
	}
	if _, b := get(t, url+"/version"); !strings.Contains(string(b), `"version":"0.31.0`) {
		t.Fatalf("/version %s", b)
	}
	p := seqTokens(33, 1)
	for range 2 {
		post(t, url+"/v1/completions", map[string]any{"prompt": p, "max_tokens": 2}, nil)
	}
	_, b = get(t, url+"/metrics")
	for _, want := range []string{
		`vllm:num_requests_running{engine="0",model_name="mock-model"} 0`,
		`vllm:num_requests_waiting{engine="0",model_name="mock-model"} 0`,
		`vllm:kv_cache_usage_perc{engine="0",model_name="mock-model"} 0`,
		`vllm:prefix_cache_queries_total{engine="0",model_name="mock-model"} 66`,
		`vllm:prefix_cache_hits_total{engine="0",model_name="mock-model"} 32`,
		`vllm:request_success_total{engine="0",finished_reason="length",model_name="mock-model"} 2`,
		"# TYPE vllm:prefix_cache_hits_total counter",
		"# TYPE vllm:num_requests_running gauge",
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	v.Close()
	if code, _ := get(t, url+"/health"); code != http.StatusServiceUnavailable {
		t.Fatalf("/health after close: %d", code)
	}
}

func TestClientDisconnectAborts(t *testing.T) {
	sc := testSim()
	sc.SpeedupRatio = 1 // real decode steps (~10 ms each): the request outlives the read
	v, url := startVLLM(t, VLLMConfig{Sim: sc})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := strings.NewReader(`{"prompt":[1,2,3,4,5],"max_tokens":2000,"stream":true}`)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", body)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the request to run", func() bool { return v.Engine().Stats().Running == 1 })
	cancel()
	resp.Body.Close()
	waitFor(t, "the abort", func() bool {
		s := v.Engine().Stats()
		return s.Running == 0 && s.Waiting == 0 && v.Engine().Counters().Aborted == 1
	})
	if got := v.Engine().Counters().OutputTokens; got >= 2000 {
		t.Fatalf("the request ran to the end (%d tokens)", got)
	}
}
