package frontend

import (
	"strconv"
	"unicode/utf8"
)

// textChunk renders the SSE events that carry one piece of generated text,
// the hot path of streaming (one per token). Everything but the text is
// fixed for a stream, so it is rendered once; a chunk is then two copies
// and an escaped string: no maps, no reflection, no per-chunk allocation.
type textChunk struct {
	prefix, suffix []byte
	buf            []byte
}

// newTextChunk pre-renders `data: {…"<field>":` and the rest of the object.
// For chat, field is "content" inside a delta; for completions, "text".
func newTextChunk(id, object string, created int64, model string, chat, includeUsage bool) *textChunk {
	p := []byte(`data: {"id":`)
	p = appendJSONString(p, id)
	p = append(p, `,"object":`...)
	p = appendJSONString(p, object)
	p = append(p, `,"created":`...)
	p = strconv.AppendInt(p, created, 10)
	p = append(p, `,"model":`...)
	p = appendJSONString(p, model)
	var s []byte
	if chat {
		p = append(p, `,"choices":[{"index":0,"delta":{"content":`...)
		s = append(s, `},"logprobs":null,"finish_reason":null}]`...)
	} else {
		p = append(p, `,"choices":[{"index":0,"text":`...)
		s = append(s, `,"logprobs":null,"finish_reason":null}]`...)
	}
	if includeUsage {
		s = append(s, `,"usage":null`...)
	}
	s = append(s, "}\n\n"...)
	return &textChunk{prefix: p, suffix: s}
}

// render returns the event for text; valid until the next call.
func (c *textChunk) render(text string) []byte {
	b := append(c.buf[:0], c.prefix...)
	b = appendJSONString(b, text)
	b = append(b, c.suffix...)
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
