package frontend

import (
	"context"
	"net/http"

	"github.com/kvmesh/kvmesh/internal/stages"
	"github.com/kvmesh/kvmesh/tokenizer"
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

// promptText is a chat prompt's rendered text, built only when asked
// (keepAnswer, after the response): from the rendering's pieces when the
// model's template renders per message.
type promptText struct {
	s  string
	rc *tokenizer.RenderedChat
}

func (p promptText) String() string {
	if p.rc != nil {
		return p.rc.Text()
	}
	return p.s
}

func (p promptText) empty() bool { return p.rc == nil && p.s == "" }

// encodeChat tokenizes a chat request's messages up to the context limit.
// text is the rendered prompt when the model renders and encodes apart
// (RenderChat), else empty. A request whose parse continued a memo entry
// rendered by the same template renders only its new messages, and on a
// prefix-cache hit nothing of the history's text is copied.
func (s *Server) encodeChat(r *http.Request, m *Model, req *chatRequest) (ids []uint32, text promptText, aerr *apiError) {
	release, aerr := s.tokenizing(r.Context())
	if aerr != nil {
		return nil, text, aerr
	}
	defer release()
	msgs, salt := req.Messages, req.CacheSalt
	limit := s.maxContext(m)
	if m.RenderChat != nil && m.EncodeRendered != nil {
		var rc *tokenizer.RenderedChat
		var over bool
		var err error
		if m.appender != nil {
			rc, over, err = s.renderAfter(m, req, limit)
			text.rc = rc
		} else {
			text.s, over, err = m.RenderChat(msgs, limit)
		}
		switch {
		case err != nil:
			return nil, promptText{}, invalid("messages", "the chat template could not render these messages: %v", err)
		case over:
			return nil, promptText{}, tooManyTokens("messages", limit)
		}
		stages.From(r.Context()).Mark(stages.Template)
		if rc != nil && m.encodeFrom != nil {
			// The prefix cache's scan of the text starts where the turn
			// before's stood at the end of its messages (the same bytes).
			var from *tokenizer.CutScan
			if e := req.memo; e != nil && e.render == m.appender && e.written.Messages() == len(e.msgs) {
				from = e.scan
			}
			ids, done, scan, hashes := m.encodeFrom(rc, salt, limit, from, rc.MessagesEnd())
			if !done {
				return nil, promptText{}, tooManyTokens("messages", limit)
			}
			req.scan, req.hashes = scan, hashes
			s.remember(req, m, rc, scan)
			return ids, text, nil
		}
		ids, done := m.EncodeRendered(text.String(), salt, limit)
		if !done {
			return nil, promptText{}, tooManyTokens("messages", limit)
		}
		s.remember(req, m, rc, nil)
		return ids, text, nil
	}
	if m.EncodeChatUpTo == nil {
		ids, err := m.EncodeChat(msgs)
		if err != nil {
			return nil, promptText{}, invalid("messages", "the chat template could not render these messages: %v", err)
		}
		s.remember(req, m, nil, nil)
		return ids, promptText{}, nil
	}
	ids, done, err := m.EncodeChatUpTo(msgs, limit)
	switch {
	case err != nil:
		return nil, promptText{}, invalid("messages", "the chat template could not render these messages: %v", err)
	case !done:
		return nil, promptText{}, tooManyTokens("messages", limit)
	}
	s.remember(req, m, nil, nil)
	return ids, promptText{}, nil
}

// renderAfter renders req's messages with m's appender, after the
// rendering its memo entry holds when the same template made it; an
// error there is the whole rendering's (worded with the right message).
func (s *Server) renderAfter(m *Model, req *chatRequest, limit int) (*tokenizer.RenderedChat, bool, error) {
	if e := req.memo; e != nil && e.render == m.appender && e.written.Messages() == len(e.msgs) {
		rc, over, err := m.appender.Render(&e.written, tmsgs(req.Messages[len(e.msgs):]), limit)
		if err == nil {
			s.memo.rendered.Add(1)
			return &rc, over, nil
		}
	}
	rc, over, err := m.appender.Render(nil, tmsgs(req.Messages), limit)
	return &rc, over, err
}

func tmsgs(msgs []Message) []tokenizer.Message {
	tm := make([]tokenizer.Message, len(msgs))
	for i, msg := range msgs {
		tm[i] = tokenizer.Message{Role: msg.Role, Content: msg.Content, Name: msg.Name}
	}
	return tm
}

// remember keeps a chat request that parsed and rendered in the memo, for
// the conversation's next turn (rc: its rendering, nil when the model's
// template does not render per message).
func (s *Server) remember(req *chatRequest, m *Model, rc *tokenizer.RenderedChat, scan *tokenizer.CutScan) {
	if s.memo == nil || !req.split.once {
		return
	}
	e := &memoEntry{salt: req.CacheSalt, end: req.split.lastEnd, msgsAt: req.split.msgsAt,
		before: req.split.before, msgs: req.Messages}
	if rc != nil {
		e.render, e.written, e.scan = m.appender, *rc, scan
	}
	s.memo.store(e, req.body, &req.keys, req.memo)
}

// keepAnswer gives a finished chat turn (its rendered prompt and the
// answer that an end token ended) to the model's KeepAnswer, after the
// response went out, so the conversation's next turn, which resends the
// answer, tokenizes only what follows it. It is optional work: done only
// when a tokenizer slot is free at once.
func (s *Server) keepAnswer(m *Model, req *chatRequest, text promptText, answer string, out genOutcome) {
	if m.KeepAnswer == nil || text.empty() || !out.EndsEOS {
		return
	}
	salt := req.CacheSalt
	select {
	case s.tokenSlots <- struct{}{}:
		defer func() { <-s.tokenSlots }()
		prompt := text.String()
		if m.keepAnswerFrom != nil && req.scan != nil {
			// The prompt's messages were scanned: only the generation
			// prompt and the answer are.
			m.keepAnswerFrom(salt, prompt, answer, out.EOS, req.scan)
			return
		}
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
