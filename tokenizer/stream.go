package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// Decoder turns a stream of token ids into text for streaming. Byte-level
// tokens can end in the middle of a UTF-8 character (an emoji is often two
// or more tokens); Add returns only complete characters and holds the
// incomplete tail until the next token completes it. Bytes that can never
// form a character become U+FFFD. A Decoder is for one stream; not safe for
// concurrent use.
type Decoder struct {
	tok         Tokenizer
	skipSpecial bool
	pending     []byte
}

// NewDecoder returns a streaming decoder. With skipSpecial, special tokens
// (chat markers, EOS) produce no text, as OpenAI-style outputs expect.
func NewDecoder(tok Tokenizer, skipSpecial bool) *Decoder {
	return &Decoder{tok: tok, skipSpecial: skipSpecial}
}

// Add feeds one token and returns the text that is now complete (possibly "").
// Unknown ids add nothing.
func (d *Decoder) Add(id uint32) string {
	if d.skipSpecial && d.tok.IsSpecial(id) {
		return ""
	}
	d.pending = append(d.pending, d.tok.Piece(id)...)
	return d.take(false)
}

// Flush returns whatever is held back, with an unfinished character replaced
// by U+FFFD; call it when the stream ends.
func (d *Decoder) Flush() string { return d.take(true) }

// take emits the longest prefix of pending that is final: valid characters,
// and invalid bytes (as U+FFFD) that no later byte can repair. At the end it
// keeps a tail that is a proper prefix of a valid encoding, unless final.
func (d *Decoder) take(final bool) string {
	p := d.pending
	if len(p) == 0 {
		return ""
	}
	if utf8.Valid(p) {
		d.pending = d.pending[:0]
		return string(p)
	}
	var b strings.Builder
	b.Grow(len(p))
	i := 0
	for i < len(p) {
		r, n := utf8.DecodeRune(p[i:])
		if r != utf8.RuneError || n > 1 {
			b.WriteRune(r)
			i += n
			continue
		}
		if !final && incompletePrefix(p[i:]) {
			break // wait for the rest of this character
		}
		b.WriteRune(utf8.RuneError)
		i += maximalInvalid(p[i:])
	}
	d.pending = append(d.pending[:0], p[i:]...)
	return b.String()
}

// incompletePrefix reports whether p (which starts with an invalid or
// truncated sequence) is a truncated but so-far valid encoding that runs to
// the end of p.
func incompletePrefix(p []byte) bool {
	need, lo, hi := seqShape(p[0])
	if need == 0 || len(p) > need {
		return false
	}
	for k := 1; k < len(p); k++ {
		c := p[k]
		if k == 1 && (c < lo || c > hi) || k > 1 && (c < 0x80 || c > 0xBF) {
			return false
		}
	}
	return len(p) < need+1 // a complete sequence would have decoded
}

// seqShape gives the continuation bytes a lead byte needs and the allowed
// range of the first continuation (RFC 3629 table); need 0 for invalid leads.
func seqShape(c byte) (need int, lo, hi byte) {
	lo, hi = 0x80, 0xBF
	switch {
	case c >= 0xC2 && c <= 0xDF:
		need = 1
	case c == 0xE0:
		need, lo = 2, 0xA0
	case c == 0xED:
		need, hi = 2, 0x9F
	case c >= 0xE1 && c <= 0xEF:
		need = 2
	case c == 0xF0:
		need, lo = 3, 0x90
	case c >= 0xF1 && c <= 0xF3:
		need = 3
	case c == 0xF4:
		need, hi = 3, 0x8F
	}
	return need, lo, hi
}

// maximalInvalid is the length of the maximal invalid subpart at the start
// of p, which becomes one U+FFFD (the WHATWG/Python "replace" rule).
func maximalInvalid(p []byte) int {
	need, lo, hi := seqShape(p[0])
	i := 1
	for ; i <= need && i < len(p); i++ {
		c := p[i]
		if i == 1 && (c < lo || c > hi) || i > 1 && (c < 0x80 || c > 0xBF) {
			break
		}
	}
	return i
}

// StopMatcher finds stop strings in streamed text. Feed returns the text
// that is safe to send now: it holds back a tail that could be the start of
// a stop string, and once a stop string appears it returns only the text
// before it and reports the hit; the stop string itself is never returned,
// nor anything after it. Cuts fall on UTF-8 character boundaries.
type StopMatcher struct {
	stops   []string
	maxLen  int
	held    string
	stopped bool
	hit     string
}

// NewStopMatcher builds a matcher; empty stop strings are ignored.
func NewStopMatcher(stops []string) *StopMatcher {
	m := &StopMatcher{}
	for _, s := range stops {
		if s != "" {
			m.stops = append(m.stops, s)
			m.maxLen = max(m.maxLen, len(s))
		}
	}
	return m
}

// Feed adds text and returns what may be emitted, and whether a stop string
// was hit (then the stream should end; further Feeds return "", true).
func (m *StopMatcher) Feed(text string) (emit string, stopped bool) {
	if m.stopped {
		return "", true
	}
	if len(m.stops) == 0 {
		return text, false
	}
	buf := m.held + text
	// Earliest stop wins; at the same position the longest.
	at, which := -1, ""
	for _, s := range m.stops {
		if i := strings.Index(buf, s); i >= 0 && (at < 0 || i < at || i == at && len(s) > len(which)) {
			at, which = i, s
		}
	}
	if at >= 0 {
		m.stopped, m.hit, m.held = true, which, ""
		return buf[:at], true
	}
	// Hold the longest suffix that is a proper prefix of some stop string.
	keep := 0
	for _, s := range m.stops {
		for k := min(len(s)-1, len(buf)); k > keep; k-- {
			if strings.HasSuffix(buf, s[:k]) {
				keep = k
				break
			}
		}
	}
	cut := len(buf) - keep
	for cut > 0 && cut < len(buf) && !utf8.RuneStart(buf[cut]) {
		cut-- // never split a character (only matters for invalid UTF-8)
	}
	m.held = buf[cut:]
	return buf[:cut], false
}

// Flush returns the held-back text at the end of the stream (no stop hit).
func (m *StopMatcher) Flush() string {
	if m.stopped {
		return ""
	}
	h := m.held
	m.held = ""
	return h
}

// Hit returns the stop string that ended the stream, or "".
func (m *StopMatcher) Hit() string { return m.hit }
