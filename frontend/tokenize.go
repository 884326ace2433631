package frontend

import (
	"context"
	"net/http"

	"github.com/kvmesh/kvmesh/internal/stages"
)

// Tokenizing is CPU work a client chooses the size of; it is bounded twice.
// Each prompt is tokenized only up to the context limit (Model.EncodeUpTo),
// and at most Config.Tokenizers prompts are tokenized at once: a request
// waits for a slot, for as long as its client does. Waiting rather than
// refusing: with the limit a prompt holds a slot for milliseconds, so a
// burst is served a little later instead of failing, and a queue of
// waiters costs no CPU.

// tokenizing takes a tokenizer slot for the request; release gives it back.
func (s *Server) tokenizing(ctx context.Context) (release func(), aerr *apiError) {
	select {
	case s.tokenSlots <- struct{}{}:
		return func() { <-s.tokenSlots }, nil
	case <-ctx.Done():
		return nil, cancelled(ctx)
	}
}

// tooManyTokens answers a prompt that tokenizing stopped past limit.
func tooManyTokens(param string, limit int) *apiError {
	return contextExceeded(param, "This model's maximum context length is %d tokens. However, your %s resulted in more than %d tokens. Please reduce the length of the %s.",
		limit, param, limit, param)
}

// encodeChat tokenizes a chat request's messages up to the context limit;
// salt is the request's cache salt. text is the rendered prompt when the
// model renders and encodes apart (RenderChat), else "".
func (s *Server) encodeChat(r *http.Request, m *Model, msgs []Message, salt string) (ids []uint32, text string, aerr *apiError) {
	release, aerr := s.tokenizing(r.Context())
	if aerr != nil {
		return nil, "", aerr
	}
	defer release()
	limit := s.maxContext(m)
	if m.RenderChat != nil && m.EncodeRendered != nil {
		text, over, err := m.RenderChat(msgs, limit)
		switch {
		case err != nil:
			return nil, "", invalid("messages", "the chat template could not render these messages: %v", err)
		case over:
			return nil, "", tooManyTokens("messages", limit)
		}
		stages.From(r.Context()).Mark(stages.Template)
		ids, done := m.EncodeRendered(text, salt, limit)
		if !done {
			return nil, "", tooManyTokens("messages", limit)
		}
		return ids, text, nil
	}
	if m.EncodeChatUpTo == nil {
		ids, err := m.EncodeChat(msgs)
		if err != nil {
			return nil, "", invalid("messages", "the chat template could not render these messages: %v", err)
		}
		return ids, "", nil
	}
	ids, done, err := m.EncodeChatUpTo(msgs, limit)
	switch {
	case err != nil:
		return nil, "", invalid("messages", "the chat template could not render these messages: %v", err)
	case !done:
		return nil, "", tooManyTokens("messages", limit)
	}
	return ids, "", nil
}

// keepAnswer gives a finished chat turn (its rendered prompt and the
// answer that an end token ended) to the model's KeepAnswer, after the
// response went out, so the conversation's next turn, which resends the
// answer, tokenizes only what follows it. It is optional work: done only
// when a tokenizer slot is free at once.
func (s *Server) keepAnswer(m *Model, salt, prompt, answer string, out genOutcome) {
	if m.KeepAnswer == nil || prompt == "" || !out.EndsEOS {
		return
	}
	select {
	case s.tokenSlots <- struct{}{}:
		defer func() { <-s.tokenSlots }()
		m.KeepAnswer(salt, prompt, answer, out.EOS)
	default:
	}
}

// encodeText tokenizes one plain-text prompt up to the context limit.
func (s *Server) encodeText(r *http.Request, m *Model, text string) ([]uint32, *apiError) {
	release, aerr := s.tokenizing(r.Context())
	if aerr != nil {
		return nil, aerr
	}
	defer release()
	if m.EncodeUpTo == nil {
		return m.Encode(text), nil
	}
	limit := s.maxContext(m)
	ids, done := m.EncodeUpTo(text, limit)
	if !done {
		return nil, tooManyTokens("prompt", limit)
	}
	return ids, nil
}
