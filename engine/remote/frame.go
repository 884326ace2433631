package remote

import (
	"encoding/json"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// FrameDecoder is a stream frame type that decodes its engine's common
// frames itself: every streamed token is one frame, and encoding/json
// (a validating scan, then reflection over every field name) cost more
// CPU than the rest of relaying the token. DecodeFrame reports false for
// anything it does not take (escaped keys, a key differing only in case,
// a duplicate key, a value of the wrong type, a malformed frame); the
// reader then decodes the frame with encoding/json into a zero value, so
// an answer DecodeFrame gives is the one encoding/json would give.
type FrameDecoder interface {
	DecodeFrame(data []byte) bool
}

// decodeFrame decodes data into f, through its own decoder when it has
// one, after preset (if not nil) prepared f for it; a declined frame is
// decoded by encoding/json into a zero value, preset undone.
func decodeFrame[T any](data []byte, f *T, preset func(*T)) error {
	if d, ok := any(f).(FrameDecoder); ok {
		if preset != nil {
			preset(f)
		}
		if d.DecodeFrame(data) {
			return nil
		}
		var zero T
		*f = zero
	}
	return json.Unmarshal(data, f)
}

// Scan walks one JSON text strictly, for FrameDecoder implementations:
// every method returns false on input it does not take, and a decoder
// then declines the frame. It accepts only what encoding/json accepts.
type Scan struct {
	b []byte
	i int
}

// NewScan scans b.
func NewScan(b []byte) *Scan { return &Scan{b: b} }

func (s *Scan) ws() {
	for s.i < len(s.b) && isJSONSpace(s.b[s.i]) {
		s.i++
	}
}

func (s *Scan) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// End reports whether only whitespace is left.
func (s *Scan) End() bool {
	s.ws()
	return s.i == len(s.b)
}

// Null consumes a null literal if one is next.
func (s *Scan) Null() bool {
	if s.peek() == 'n' && s.lit("null") {
		return true
	}
	return false
}

func (s *Scan) lit(w string) bool {
	if len(s.b)-s.i >= len(w) && string(s.b[s.i:s.i+len(w)]) == w {
		s.i += len(w)
		return true
	}
	return false
}

// Open consumes c ('{' or '['), opening an object or an array; walk its
// members or elements with More.
func (s *Scan) Open(c byte) bool {
	if s.peek() != c {
		return false
	}
	s.i++
	return true
}

// More reports whether another member or element follows in the object
// or array Open opened (close is its '}' or ']'), consuming the comma
// before it or the close after the last; first is true on the first call.
// ok is false on anything else.
func (s *Scan) More(close byte, first bool) (more, ok bool) {
	switch c := s.peek(); {
	case c == close:
		s.i++
		return false, true
	case first:
		return true, true
	case c == ',':
		s.i++
		return true, true
	}
	return false, false
}

// Key reads an object member's key and its colon; the scanner is then at
// the value. A key with an escape or a non-ASCII byte is not taken. The
// slice is the input's.
func (s *Scan) Key() ([]byte, bool) {
	if s.peek() != '"' {
		return nil, false
	}
	start := s.i + 1
	end := start
	for end < len(s.b) && s.b[end] != '"' {
		if c := s.b[end]; c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
			return nil, false
		}
		end++
	}
	if end == len(s.b) {
		return nil, false
	}
	s.i = end + 1
	if s.peek() != ':' {
		return nil, false
	}
	s.i++
	s.ws()
	return s.b[start:end], true
}

// Uint32s appends a JSON array of unsigned integers to dst (non-nil, as
// encoding/json makes an empty array); null gives nil.
func (s *Scan) Uint32s(dst []uint32) ([]uint32, bool) {
	dst, _, ok := s.Uint32sFrom(dst, 0)
	return dst, ok
}

// Uint32sFrom is Uint32s that checks but leaves out the array's first
// skip elements; skipped is how many it left out (fewer than skip when
// the array is shorter).
func (s *Scan) Uint32sFrom(dst []uint32, skip int) (out []uint32, skipped int, ok bool) {
	if s.Null() {
		return nil, 0, true
	}
	if dst == nil {
		dst = []uint32{}
	}
	if !s.Open('[') {
		return nil, 0, false
	}
	for first := true; ; first = false {
		more, ok := s.More(']', first)
		if !ok {
			return nil, 0, false
		}
		if !more {
			return dst, skipped, true
		}
		s.ws()
		start := s.i
		var v uint64
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			v = v*10 + uint64(s.b[s.i]-'0')
			if v > 1<<32-1 {
				return nil, 0, false
			}
			s.i++
		}
		n := s.i - start
		if n == 0 || (n > 1 && s.b[start] == '0') {
			return nil, 0, false
		}
		if s.i < len(s.b) {
			switch s.b[s.i] {
			case '.', 'e', 'E':
				return nil, 0, false // a number, but not an unsigned integer
			}
		}
		if skipped < skip {
			skipped++
			continue
		}
		dst = append(dst, uint32(v))
	}
}

// Int decodes an integer as encoding/json does into an int: no
// fraction, no exponent, within int64.
func (s *Scan) Int() (int, bool) {
	s.ws()
	neg := false
	if s.i < len(s.b) && s.b[s.i] == '-' {
		neg = true
		s.i++
	}
	start := s.i
	var v uint64
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		v = v*10 + uint64(s.b[s.i]-'0')
		if v > 1<<63 {
			return 0, false
		}
		s.i++
	}
	n := s.i - start
	if n == 0 || (n > 1 && s.b[start] == '0') || (!neg && v > 1<<63-1) {
		return 0, false
	}
	if s.i < len(s.b) {
		switch s.b[s.i] {
		case '.', 'e', 'E':
			return 0, false
		}
	}
	if neg {
		return int(-v), true
	}
	return int(v), true
}

// String decodes a JSON string as encoding/json does: escapes, UTF-16
// surrogate pairs, and U+FFFD for invalid UTF-8 or a lone surrogate.
func (s *Scan) String() (string, bool) {
	raw, ok := s.stringToken()
	if !ok {
		return "", false
	}
	in := raw[1 : len(raw)-1]
	plain := true
	for _, c := range in {
		if c == '\\' || c >= utf8.RuneSelf {
			plain = false
			break
		}
	}
	if plain {
		return string(in), true
	}
	return unquote(in), true
}

// unquote decodes a string's contents that stringToken checked.
func unquote(in []byte) string {
	out := make([]byte, 0, len(in)+utf8.UTFMax)
	for r := 0; r < len(in); {
		c := in[r]
		switch {
		case c == '\\':
			switch in[r+1] {
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			case 'u':
				rr := hex4(in[r+2 : r+6])
				r += 6
				if utf16.IsSurrogate(rr) {
					if r+6 <= len(in) && in[r] == '\\' && in[r+1] == 'u' && isHex4(in[r+2:r+6]) {
						if dec := utf16.DecodeRune(rr, hex4(in[r+2:r+6])); dec != unicode.ReplacementChar {
							out = utf8.AppendRune(out, dec)
							r += 6
							continue
						}
					}
					rr = unicode.ReplacementChar
				}
				out = utf8.AppendRune(out, rr)
				continue
			default: // '"', '\\', '/'
				out = append(out, in[r+1])
			}
			r += 2
		case c < utf8.RuneSelf:
			out = append(out, c)
			r++
		default:
			rr, size := utf8.DecodeRune(in[r:])
			if rr == utf8.RuneError && size == 1 {
				out = utf8.AppendRune(out, unicode.ReplacementChar)
			} else {
				out = append(out, in[r:r+size]...)
			}
			r += size
		}
	}
	return string(out)
}

func isHex4(b []byte) bool {
	for _, c := range b {
		if !isHex(c) {
			return false
		}
	}
	return true
}

// hex4 is the value of four hex digits stringToken checked.
func hex4(b []byte) rune {
	var v rune
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		default:
			c = c - 'A' + 10
		}
		v = v<<4 | rune(c)
	}
	return v
}

// stringToken consumes a string, checking its escapes, and returns it
// with its quotes.
func (s *Scan) stringToken() ([]byte, bool) {
	if s.peek() != '"' {
		return nil, false
	}
	start := s.i
	s.i++
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return s.b[start:s.i], true
		case c < 0x20:
			return nil, false
		case c == '\\':
			if s.i+1 >= len(s.b) {
				return nil, false
			}
			switch s.b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if s.i+6 > len(s.b) {
					return nil, false
				}
				for _, h := range s.b[s.i+2 : s.i+6] {
					if !isHex(h) {
						return nil, false
					}
				}
				s.i += 6
			default:
				return nil, false
			}
		default:
			s.i++
		}
	}
	return nil, false
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// Raw consumes any value and returns its bytes (a slice of the input).
func (s *Scan) Raw() ([]byte, bool) {
	s.ws()
	start := s.i
	if !s.Skip() {
		return nil, false
	}
	return s.b[start:s.i], true
}

// Skip consumes any value, checking its syntax.
func (s *Scan) Skip() bool {
	switch c := s.peek(); {
	case c == '{' || c == '[':
		s.i++
		close := byte('}')
		if c == '[' {
			close = ']'
		}
		for first := true; ; first = false {
			more, ok := s.More(close, first)
			if !ok {
				return false
			}
			if !more {
				return true
			}
			if c == '{' {
				if _, ok := s.Key(); !ok {
					return false
				}
			}
			if !s.Skip() {
				return false
			}
		}
	case c == '"':
		_, ok := s.stringToken()
		return ok
	case c == 't':
		return s.lit("true")
	case c == 'f':
		return s.lit("false")
	case c == 'n':
		return s.lit("null")
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	}
	return false
}

func (s *Scan) number() bool {
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	digits := func() int {
		n := 0
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
			n++
		}
		return n
	}
	if s.i < len(s.b) && s.b[s.i] == '0' {
		s.i++
	} else if digits() == 0 {
		return false
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if digits() == 0 {
			return false
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if digits() == 0 {
			return false
		}
	}
	return true
}

// Object walks the object that follows as a frame decoder must: member(i)
// decodes the value of a member whose key is names[i]; any other member
// is skipped, but one named as names[i] in another case (encoding/json
// would fold it onto that field) or a member named twice (encoding/json
// merges such) declines the frame. names holds at most 64 keys.
func (s *Scan) Object(names []string, member func(i int) bool) bool {
	if !s.Open('{') {
		return false
	}
	var seen uint64
	for first := true; ; first = false {
		more, ok := s.More('}', first)
		if !ok {
			return false
		}
		if !more {
			return true
		}
		key, ok := s.Key()
		if !ok {
			return false
		}
		i := -1
		for j, n := range names {
			if string(key) == n {
				i = j
				break
			}
		}
		if i < 0 {
			if FoldsTo(string(key), names...) || !s.Skip() {
				return false
			}
			continue
		}
		if seen&(1<<i) != 0 {
			return false
		}
		seen |= 1 << i
		if !member(i) {
			return false
		}
	}
}

// Array walks the array that follows, elem decoding each element.
func (s *Scan) Array(elem func() bool) bool {
	if !s.Open('[') {
		return false
	}
	for first := true; ; first = false {
		more, ok := s.More(']', first)
		if !ok {
			return false
		}
		if !more {
			return true
		}
		if !elem() {
			return false
		}
	}
}

// RawCopy consumes any value and returns a copy of its bytes.
func (s *Scan) RawCopy() (json.RawMessage, bool) {
	raw, ok := s.Raw()
	return append(json.RawMessage(nil), raw...), ok
}

// Usage decodes a usage object (rare in a stream: the last frame's) with
// encoding/json.
func (s *Scan) Usage() (*Usage, bool) {
	raw, ok := s.Raw()
	if !ok {
		return nil, false
	}
	u := new(Usage)
	return u, json.Unmarshal(raw, u) == nil
}

// FoldsTo reports whether key is one of names in another case:
// encoding/json would match it to that field, a decoder should decline.
func FoldsTo(key string, names ...string) bool {
	for _, n := range names {
		if strings.EqualFold(key, n) {
			return true
		}
	}
	return false
}
