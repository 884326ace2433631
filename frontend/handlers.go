package frontend

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/kvmesh/kvmesh/internal/stages"
	"github.com/kvmesh/kvmesh/kv"
)

type usageJSON struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func toUsage(u usage) *usageJSON {
	j := &usageJSON{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.PromptTokens + u.CompletionTokens}
	j.PromptTokensDetails.CachedTokens = u.CachedTokens
	return j
}

// accept reads and parses a request and resolves its model; when anything
// is wrong it has already answered, and ok is false. When ok, the caller
// gives body back (releaseBody) once it is done with the request.
func accept[T any](s *Server, w http.ResponseWriter, r *http.Request, parse func([]byte) (T, *apiError), model func(T) string) (req T, m *Model, body []byte, ok bool) {
	clk := stages.From(r.Context())
	body, aerr := s.readBody(w, r)
	clk.Mark(stages.ReadBody)
	if aerr == nil {
		req, aerr = parse(body)
	}
	if aerr == nil {
		m, aerr = s.lookupModel(model(req))
	}
	clk.Mark(stages.Parse)
	if aerr != nil {
		releaseBody(body)
		if aerr != errAnswered {
			writeError(w, aerr)
		}
		return req, nil, nil, false
	}
	return req, m, body, true
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) string {
	req, m, body, ok := accept(s, w, r, s.parseChat, func(c *chatRequest) string { return c.Model })
	if !ok {
		return ""
	}
	defer releaseBody(body)
	_, tsp := childSpan(r.Context(), "tokenize")
	prompt, promptText, aerr := s.encodeChat(r, m, req)
	if tsp.IsRecording() { // the variadic attributes would allocate even for a no-op span
		tsp.SetAttributes(attribute.Int("gen_ai.usage.input_tokens", len(prompt)))
	}
	tsp.End()
	stages.From(r.Context()).Mark(stages.Tokenize)
	if aerr != nil {
		writeError(w, aerr)
		return m.Name
	}
	id, created := newID("chatcmpl-"), time.Now().Unix()
	if !req.Stream {
		var text []byte
		out, aerr := s.generate(r.Context(), m, id, prompt, req.hashes, req.genParams, func(t string) error {
			text = append(text, t...)
			return nil
		}, nil)
		if aerr != nil {
			writeError(w, aerr)
			return m.Name
		}
		defer s.keepAnswer(m, req, promptText, string(text), out)
		writeJSON(w, http.StatusOK, map[string]any{
			"id": id, "object": "chat.completion", "created": created, "model": m.Name,
			"choices": []any{map[string]any{
				"index":         0,
				"message":       map[string]any{"role": "assistant", "content": string(text)},
				"logprobs":      nil,
				"finish_reason": openAIFinish(out.Finish),
			}},
			"usage": toUsage(out.Usage),
		})
		return m.Name
	}

	sse := newSSE(w)
	ev := newStreamEvents(id, "chat.completion.chunk", created, m.Name, true, req.IncludeUsage)
	// The answer's text, for keepAnswer (only when the model keeps answers).
	var answer []byte
	keep := m.KeepAnswer != nil && !promptText.empty()
	out, aerr := s.generate(r.Context(), m, id, prompt, req.hashes, req.genParams, func(t string) error {
		if keep {
			answer = append(answer, t...)
		}
		if !sse.started {
			// Buffered: it goes out in one write with the first text.
			if err := sse.write(ev.role()); err != nil {
				return err
			}
		}
		return sse.write(ev.render(t))
	}, sse.flush)
	if aerr != nil {
		sse.fail(aerr)
		return m.Name
	}
	if !sse.started {
		_ = sse.write(ev.role())
	}
	sse.end(ev, out)
	s.keepAnswer(m, req, promptText, string(answer), out)
	return m.Name
}

func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request) string {
	req, m, body, ok := accept(s, w, r, parseCompletion, func(c *completionRequest) string { return c.Model })
	if !ok {
		return ""
	}
	defer releaseBody(body)
	var prompts [][]uint32
	var texts []string
	if len(req.Texts) > 0 {
		_, tsp := childSpan(r.Context(), "tokenize")
		n := 0
		for _, t := range req.Texts {
			ids, aerr := s.encodeText(r, m, t)
			if aerr != nil {
				tsp.End()
				writeError(w, aerr)
				return m.Name
			}
			prompts = append(prompts, ids)
			texts = append(texts, t)
			n += len(ids)
		}
		if tsp.IsRecording() {
			tsp.SetAttributes(attribute.Int("gen_ai.usage.input_tokens", n))
		}
		tsp.End()
		stages.From(r.Context()).Mark(stages.Tokenize)
	}
	for i, ids := range req.TokenPrompts {
		if aerr := checkVocab(m, i, len(req.TokenPrompts) > 1, ids); aerr != nil {
			writeError(w, aerr)
			return m.Name
		}
		prompts = append(prompts, ids)
		if req.Echo {
			d := m.NewDetokenizer()
			var b []byte
			for _, id := range ids {
				b = append(b, d.Add(id)...)
			}
			texts = append(texts, string(append(b, d.Flush()...)))
		}
	}
	for i, p := range prompts {
		if len(p) == 0 {
			writeError(w, invalid("prompt", "prompt %d is empty after tokenization", i))
			return m.Name
		}
	}
	id, created := newID("cmpl-"), time.Now().Unix()
	if !req.Stream {
		var choices []any
		var total usage
		for i, p := range prompts {
			var text []byte
			if req.Echo {
				text = append(text, texts[i]...)
			}
			out, aerr := s.generate(r.Context(), m, fmt.Sprintf("%s-%d", id, i), p, nil, req.genParams, func(t string) error {
				text = append(text, t...)
				return nil
			}, nil)
			if aerr != nil {
				writeError(w, aerr)
				return m.Name
			}
			total.PromptTokens += out.Usage.PromptTokens
			total.CompletionTokens += out.Usage.CompletionTokens
			total.CachedTokens += out.Usage.CachedTokens
			choices = append(choices, map[string]any{"index": i, "text": string(text), "logprobs": nil, "finish_reason": openAIFinish(out.Finish)})
		}
		writeJSON(w, http.StatusOK, map[string]any{
			"id": id, "object": "text_completion", "created": created, "model": m.Name,
			"choices": choices, "usage": toUsage(total),
		})
		return m.Name
	}

	sse := newSSE(w)
	ev := newStreamEvents(id, "text_completion", created, m.Name, false, req.IncludeUsage)
	if req.Echo {
		if err := sse.write(ev.render(texts[0])); err != nil {
			return m.Name
		}
	}
	out, aerr := s.generate(r.Context(), m, id, prompts[0], nil, req.genParams, func(t string) error {
		return sse.write(ev.render(t))
	}, sse.flush)
	if aerr != nil {
		sse.fail(aerr)
		return m.Name
	}
	sse.end(ev, out)
	return m.Name
}

// checkVocab rejects token ids the model's vocabulary does not have: the
// engine would index past its embedding table.
func checkVocab(m *Model, prompt int, batch bool, ids []uint32) *apiError {
	if m.VocabSize <= 0 {
		return nil
	}
	for j, id := range ids {
		if int64(id) >= int64(m.VocabSize) {
			at := fmt.Sprintf("prompt[%d]", j)
			if batch {
				at = fmt.Sprintf("prompt[%d][%d]", prompt, j)
			}
			return invalid("prompt", "'%s' is token id %d, outside the model's vocabulary of %d tokens (ids 0 to %d)", at, id, m.VocabSize, m.VocabSize-1)
		}
	}
	return nil
}

// sseWriter writes OpenAI's server-sent events: `data: {json}\n\n`, then
// `data: [DONE]`. Headers go out with the first event, so an error before
// any output is still a plain HTTP error.
type sseWriter struct {
	w       http.ResponseWriter
	started bool
	failed  bool
	dirty   bool // written but not flushed
}

func newSSE(w http.ResponseWriter) *sseWriter { return &sseWriter{w: w} }

func (s *sseWriter) start() {
	if s.started {
		return
	}
	s.started = true
	// As Header.Set with canonical keys, with one allocation for the four values.
	v := []string{"text/event-stream", "no-cache", "keep-alive", "no"}
	h := s.w.Header()
	h["Content-Type"] = v[0:1:1]
	h["Cache-Control"] = v[1:2:2]
	h["Connection"] = v[2:3:3]
	h["X-Accel-Buffering"] = v[3:4:4]
	s.w.WriteHeader(http.StatusOK)
}

// send buffers one event holding v as JSON (an in-stream error); like
// every event after the last token, it goes out with the response's end.
func (s *sseWriter) send(v any) error {
	if s.failed {
		return errClientWrite
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	buf := make([]byte, 0, len(b)+8)
	return s.write(append(append(append(buf, "data: "...), b...), "\n\n"...))
}

// write buffers one complete event; flush sends what is buffered.
func (s *sseWriter) write(event []byte) error {
	if s.failed {
		return errClientWrite
	}
	s.start()
	if _, err := s.w.Write(event); err != nil {
		s.failed = true
		return err
	}
	s.dirty = true
	return nil
}

func (s *sseWriter) flush() error {
	if s.failed {
		return errClientWrite
	}
	if !s.dirty {
		return nil
	}
	s.dirty = false
	if f, ok := s.w.(interface{ FlushError() error }); ok {
		if err := f.FlushError(); err != nil {
			s.failed = true
			return err
		}
		return nil
	}
	if f, ok := s.w.(http.Flusher); ok {
		f.Flush()
	}
	return nil
}

// fail reports an error: as the HTTP response if nothing was streamed yet,
// else as an in-stream error event (OpenAI's shape) before [DONE].
func (s *sseWriter) fail(e *apiError) {
	if e.Status == 499 {
		if a, ok := s.w.(interface{ abandon() }); ok {
			a.abandon() // for requests_total: not the 200 already sent
		}
		return // the client is gone
	}
	if !s.started {
		writeError(s.w, e)
		return
	}
	_ = s.send(map[string]any{"error": e})
	s.done()
}

// end writes a finished stream's last events: the finish reason, the usage
// when asked for, and [DONE].
func (s *sseWriter) end(ev *streamEvents, out genOutcome) {
	_ = s.write(ev.finish(openAIFinish(out.Finish)))
	if ev.includeUsage {
		_ = s.write(ev.usage(out.Usage))
	}
	s.done()
}

// done ends the stream. It does not flush: net/http flushes the buffer
// with the chunked terminator when the handler returns, in one write.
func (s *sseWriter) done() {
	_ = s.write([]byte("data: [DONE]\n\n"))
}

type clientWriteError struct{}

func (clientWriteError) Error() string { return "write to client failed" }

var errClientWrite error = clientWriteError{}

// openAIFinish is the finish_reason an OpenAI client reads. Only stop and
// length end a successful response; cancelled and failed generations end in
// an error instead.
func openAIFinish(f kv.FinishReason) string {
	switch f {
	case kv.FinishStop:
		return "stop"
	case kv.FinishLength:
		return "length"
	}
	return string(f)
}
