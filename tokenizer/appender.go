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
// that resends its messages can extend (ChatAppender.Render).
type RenderedChat struct {
	// Text is what RenderChat renders: the messages, then the generation
	// prompt.
	Text     string
	messages int // len(Text) without the generation prompt
	count    int // messages rendered
	content  int // their contents' length, trimmed (the length bound's)
}

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
	n := base.messages + len(gen)
	for _, m := range safe {
		n += len("<|im_start|> \n<|im_end|>\n") + len(m.Role) + len(m.Name) + len(m.Content)
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteString(base.Text[:base.messages])
	if err := a.tmpl.renderMessages(&b, base.count, safe); err != nil {
		return RenderedChat{}, false, err
	}
	out.messages = b.Len()
	b.WriteString(gen)
	out.Text, out.count, out.content = b.String(), base.count+len(msgs), content
	return out, false, nil
}
