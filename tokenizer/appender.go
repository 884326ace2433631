package tokenizer

import "strings"

// messageRenderer is a chat template that renders each message on its
// own, in order, then the generation prompt: Render(msgs, true) is the
// messages' renderings one after the other, then generationPrompt(). A
// conversation's next turn then renders only its new messages after the
// text the turn before rendered (ChatAppender). Jinja templates may look
// at the whole conversation from any message (the last index, a system
// prompt moved, reasoning dropped from earlier turns), so none is one.
type messageRenderer interface {
	renderMessages(b *strings.Builder, first int, msgs []Message) error
	generationPrompt() string
}

// ChatAppender renders a conversation after a rendered start of it,
// RenderChat's text for a template that renders each message on its own
// (ChatML). Safe for concurrent use.
type ChatAppender struct {
	tok  Tokenizer
	tmpl messageRenderer
}

// NewChatAppender returns an appender for tok and tmpl, or nil when tmpl
// may render a message differently by what follows it.
func NewChatAppender(tok Tokenizer, tmpl ChatTemplate) *ChatAppender {
	r, ok := tmpl.(messageRenderer)
	if !ok {
		return nil
	}
	return &ChatAppender{tok: tok, tmpl: r}
}

// RenderedChat is a conversation's rendered prompt, which a later turn
// that resends its messages can extend (ChatAppender.Render). Its text is
// kept in pieces, the turn before's messages shared, so a later turn's
// rendering copies nothing of the history: Text joins them, Tail is the
// last piece alone.
type RenderedChat struct {
	// parts joined are what RenderChat renders: the messages, then the
	// generation prompt (at the end of the last part).
	parts    []string
	messages int // the text's length without the generation prompt
	gen      int // the generation prompt's length
	count    int // messages rendered
	content  int // their contents' length, trimmed (the length bound's)
}

// Text is what RenderChat renders: the messages, then the generation
// prompt (built from the pieces: a copy unless there is one).
func (r *RenderedChat) Text() string { return strings.Join(r.parts, "") }

// Tail is the text from offset at on: the last piece, what the last
// Render rendered (Text()[at:] == tail).
func (r *RenderedChat) Tail() (at int, tail string) {
	if len(r.parts) == 0 {
		return 0, ""
	}
	tail = r.parts[len(r.parts)-1]
	return r.Len() - len(tail), tail
}

// Len is the text's length.
func (r *RenderedChat) Len() int { return r.messages + r.gen }

// MessagesEnd is where the messages end in Text (the generation prompt
// follows).
func (r *RenderedChat) MessagesEnd() int { return r.messages }

// Messages is how many messages Text holds.
func (r *RenderedChat) Messages() int { return r.count }

// Render is RenderChat(tok, tmpl, msgs, max) for the conversation prev's
// messages followed by msgs (prev nil: none); it reads only msgs. The
// messages prev rendered must be the conversation's first ones (the
// caller knows: its request resent them byte for byte).
func (a *ChatAppender) Render(prev *RenderedChat, msgs []Message, max int) (out RenderedChat, over bool, err error) {
	var base RenderedChat
	if prev != nil {
		base = *prev
	}
	content := base.content
	for _, m := range msgs {
		content += len(strings.TrimSpace(m.Content))
	}
	if b, ok := a.tok.(lengthBounded); ok && b.lengthOver(content, max) {
		return RenderedChat{}, true, nil
	}
	safe := defuseMessages(a.tok, msgs)
	gen := a.tmpl.generationPrompt()
	n := len(gen)
	for _, m := range safe {
		n += len("<|im_start|> \n<|im_end|>\n") + len(m.Role) + len(m.Name) + len(m.Content)
	}
	var b strings.Builder
	b.Grow(n)
	if err := a.tmpl.renderMessages(&b, base.count, safe); err != nil {
		return RenderedChat{}, false, err
	}
	out.messages = base.messages + b.Len()
	b.WriteString(gen)
	// The turn before's messages, shared: its pieces but the generation
	// prompt at the end of its last.
	if k := len(base.parts); k > 0 {
		out.parts = make([]string, k, k+1)
		copy(out.parts, base.parts)
		last := base.parts[k-1]
		out.parts[k-1] = last[:len(last)-base.gen]
	}
	out.parts = append(out.parts, b.String())
	out.gen, out.count, out.content = len(gen), base.count+len(msgs), content
	return out, false, nil
}
