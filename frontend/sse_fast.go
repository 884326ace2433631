package frontend

import (
	"strconv"
	"unicode/utf8"
)

// streamEvents renders the SSE events of one stream. Text chunks are the hot
// path of streaming (one per token). Everything but the text is fixed for a
// stream, so it is rendered once; a chunk is then two copies and an escaped
// string: no maps, no reflection, no per-chunk allocation. The stream's
// other events (the role chunk, the finish chunk, the usage chunk) share
// the same head.
type streamEvents struct {
	head           []byte // `data: {"id":…,"model":…`
	prefix, suffix []byte
	chat           bool
	includeUsage   bool
	buf            []byte
}

// newStreamEvents pre-renders the head, and `data: {…"<field>":` and the
// rest of a text chunk's object. For chat, field is "content" inside a
// delta; for completions, "text".
func newStreamEvents(id, object string, created int64, model string, chat, includeUsage bool) *streamEvents {
	// One array holds head, prefix, suffix and room for the first events:
	// each is cut to its length, so appends to one never overwrite another.
	b := make([]byte, 0, 2*(len(id)+len(object)+len(model))+512)
	b = append(b, `data: {"id":`...)
	b = appendJSONString(b, id)
	b = append(b, `,"object":`...)
	b = appendJSONString(b, object)
	b = append(b, `,"created":`...)
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"model":`...)
	b = appendJSONString(b, model)
	hl := len(b)
	b = append(b, b[:hl]...)
	if chat {
		b = append(b, `,"choices":[{"index":0,"delta":{"content":`...)
	} else {
		b = append(b, `,"choices":[{"index":0,"text":`...)
	}
	pl := len(b)
	if chat {
		b = append(b, `},"logprobs":null,"finish_reason":null}]`...)
	} else {
		b = append(b, `,"logprobs":null,"finish_reason":null}]`...)
	}
	b = appendEnd(b, includeUsage)
	sl := len(b)
	return &streamEvents{head: b[:hl:hl], prefix: b[hl:pl:pl], suffix: b[pl:sl:sl], buf: b[sl:sl], chat: chat, includeUsage: includeUsage}
}

// appendEnd closes a chunk: `"usage":null` when the client asked for a
// usage chunk (every other chunk then carries a null usage), then the
// event's end.
func appendEnd(b []byte, includeUsage bool) []byte {
	if includeUsage {
		b = append(b, `,"usage":null`...)
	}
	return append(b, "}\n\n"...)
}

// render returns the event for text; valid until the next call.
func (c *streamEvents) render(text string) []byte {
	b := append(c.buf[:0], c.prefix...)
	b = appendJSONString(b, text)
	b = append(b, c.suffix...)
	c.buf = b
	return b
}

// role returns chat's first event: the assistant role with empty content.
func (c *streamEvents) role() []byte {
	b := append(c.buf[:0], c.head...)
	b = append(b, `,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`...)
	b = appendEnd(b, c.includeUsage)
	c.buf = b
	return b
}

// finish returns the event that carries the finish reason.
func (c *streamEvents) finish(reason string) []byte {
	b := append(c.buf[:0], c.head...)
	if c.chat {
		b = append(b, `,"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":`...)
	} else {
		b = append(b, `,"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":`...)
	}
	b = appendJSONString(b, reason)
	b = append(b, "}]"...)
	b = appendEnd(b, c.includeUsage)
	c.buf = b
	return b
}

// usage returns stream_options.include_usage's last event: no choices,
// the request's token counts.
func (c *streamEvents) usage(u usage) []byte {
	b := append(c.buf[:0], c.head...)
	b = append(b, `,"choices":[],"usage":{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(u.PromptTokens), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(u.CompletionTokens), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(u.PromptTokens+u.CompletionTokens), 10)
	b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
	b = strconv.AppendInt(b, int64(u.CachedTokens), 10)
	b = append(b, "}}}\n\n"...)
	c.buf = b
	return b
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string the way encoding/json writes
// it: invalid UTF-8 becomes U+FFFD, <, > and & are \u-escaped (HTML-safe),
// and so are U+2028 and U+2029.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
