package frontend

import (
	"encoding/binary"
	"encoding/json"
	"maps"
	"unicode/utf8"
)

// A validating JSON splitter for the request path. encoding/json parsed a
// chat body three times over (the object, the messages array, each message)
// with a Decoder, a map and a copy per value: about half of the handler's
// allocations. These functions split already-read bytes into views of the
// same bytes. They accept only what encoding/json accepts and decline
// anything unusual (escaped keys, invalid UTF-8 in a key, deep nesting);
// the caller then takes the encoding/json path, which also writes the
// error messages, so errors are unchanged.

const scanMaxDepth = 256 // deeper values take the slow path

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(b []byte, i int) int {
	for i < len(b) && isJSONSpace(b[i]) {
		i++
	}
	return i
}

// scanValue returns the end of the JSON value starting at b[i], or -1 if
// there is no valid value there.
func scanValue(b []byte, i, depth int) int {
	if i >= len(b) {
		return -1
	}
	switch c := b[i]; {
	case c == '"':
		end, _ := scanString(b, i)
		return end
	case c == '{':
		if depth >= scanMaxDepth {
			return -1
		}
		i = skipSpace(b, i+1)
		if i < len(b) && b[i] == '}' {
			return i + 1
		}
		for {
			if i >= len(b) || b[i] != '"' {
				return -1
			}
			if i, _ = scanString(b, i); i < 0 {
				return -1
			}
			i = skipSpace(b, i)
			if i >= len(b) || b[i] != ':' {
				return -1
			}
			if i = scanValue(b, skipSpace(b, i+1), depth+1); i < 0 {
				return -1
			}
			i = skipSpace(b, i)
			if i >= len(b) {
				return -1
			}
			if b[i] == '}' {
				return i + 1
			}
			if b[i] != ',' {
				return -1
			}
			i = skipSpace(b, i+1)
		}
	case c == '[':
		return scanArrayWith(b, i, depth, func(b []byte, i int) int { return scanValue(b, i, depth+1) })
	case c == 't':
		return scanLiteral(b, i, "true")
	case c == 'f':
		return scanLiteral(b, i, "false")
	case c == 'n':
		return scanLiteral(b, i, "null")
	case c == '-' || c >= '0' && c <= '9':
		return scanNumber(b, i)
	}
	return -1
}

func scanLiteral(b []byte, i int, lit string) int {
	if len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit {
		return i + len(lit)
	}
	return -1
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// scanNumber follows JSON's grammar: -?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?
func scanNumber(b []byte, i int) int {
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || !isDigit(b[i]) {
			return -1
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			return -1
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	return i
}

// scanString returns the end of the string starting at b[i] (a '"') and
// whether it is plain: no escapes and valid UTF-8, so its bytes between
// the quotes are its value.
func scanString(b []byte, i int) (int, bool) {
	plain := true
	ascii := true
	start := i + 1
	for i++; i < len(b); i++ {
		// Eight bytes at a time while none needs a look.
		for len(b)-i >= 8 && !wordNeedsLook(binary.LittleEndian.Uint64(b[i:])) {
			i += 8
		}
		if i >= len(b) {
			break
		}
		switch c := b[i]; {
		case c == '"':
			if !ascii && plain && !utf8.Valid(b[start:i]) {
				plain = false
			}
			return i + 1, plain
		case c < 0x20:
			return -1, false
		case c >= 0x80:
			ascii = false
		case c == '\\':
			plain = false
			i++
			if i >= len(b) {
				return -1, false
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if len(b)-i <= 4 {
					return -1, false
				}
				for _, h := range b[i+1 : i+5] {
					if !(isDigit(h) || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
						return -1, false
					}
				}
				i += 4
			default:
				return -1, false
			}
		}
	}
	return -1, false
}

const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// wordNeedsLook reports whether any of x's eight bytes is a quote, a
// backslash, a control character or not ASCII (SWAR: a byte's high bit is
// set in (v - ones) &^ v where that byte of v is zero, and no false
// "none" is possible).
func wordNeedsLook(x uint64) bool {
	q := x ^ ('"' * ones)
	s := x ^ ('\\' * ones)
	return ((x-0x20*ones)&^x|x|(q-ones)&^q|(s-ones)&^s)&highs != 0
}

// splitObject splits a JSON object (b is the whole value, possibly with
// surrounding whitespace) into its fields; ok is false when b is not a
// valid object or takes the slow path. A repeated key keeps its last
// value, as encoding/json does.
func splitObject(b []byte) (f fields, ok bool) {
	f, end := splitObjectAt(b, skipSpace(b, 0), 0, nil)
	return f, end >= 0 && skipSpace(b, end) == len(b)
}

// splitObjectAt splits the object at b[i] (depth its nesting) and returns
// its fields and end, or end -1. value, when set, scans a field's value
// instead of scanValue (returning its end, or -1), e.g. to split it in the
// same pass; it must accept exactly what scanValue does or return -1.
func splitObjectAt(b []byte, i, depth int, value func(key string, b []byte, i int) int) (f fields, end int) {
	if i >= len(b) || b[i] != '{' || depth >= scanMaxDepth {
		return nil, -1
	}
	i = skipSpace(b, i+1)
	f = make(fields, 8)
	if i < len(b) && b[i] == '}' {
		return f, i + 1
	}
	if end = objectFields(b, i, depth, f, value); end < 0 {
		return nil, -1
	}
	return f, end
}

// objectFields splits an object's fields into f from b[i], the start of a
// key, to the object's end, which it returns (or -1).
func objectFields(b []byte, i, depth int, f fields, value func(key string, b []byte, i int) int) int {
	for {
		if i >= len(b) || b[i] != '"' {
			return -1
		}
		kend, plain := scanString(b, i)
		if kend < 0 || !plain {
			return -1
		}
		key := internKey(b[i+1 : kend-1])
		i = skipSpace(b, kend)
		if i >= len(b) || b[i] != ':' {
			return -1
		}
		vstart := skipSpace(b, i+1)
		var vend int
		if value != nil {
			vend = value(key, b, vstart)
		} else {
			vend = scanValue(b, vstart, depth+1)
		}
		if vend < 0 {
			return -1
		}
		f[key] = json.RawMessage(b[vstart:vend:vend])
		next, end := objectNext(b, vend)
		if next < 0 {
			return end
		}
		i = next
	}
}

// objectNext reads what follows an object's field value at b[i]: the next
// key's offset, or next -1 and the object's end (-1 when invalid).
func objectNext(b []byte, i int) (next, end int) {
	i = skipSpace(b, i)
	switch {
	case i >= len(b):
		return -1, -1
	case b[i] == '}':
		return -1, i + 1
	case b[i] != ',':
		return -1, -1
	}
	return skipSpace(b, i+1), 0
}

// splitMessage is one chat message's fields, and its content's value when
// the scan found it a plain string (contentOK); or, on the general path,
// the message's JSON (raw) still to be split.
type splitMessage struct {
	f         fields
	content   string
	contentOK bool
	raw       json.RawMessage
}

// splitChat is splitObject for a chat request that also splits the
// messages array, each message and each plain string content in the same
// pass: a long conversation's bytes are read once, not four times. msgs is
// nil (and the caller takes the general path) unless messages is an array
// of objects.
func splitChat(b []byte) (f fields, msgs []splitMessage, ok bool) {
	var cs chatSplit
	if !cs.split(b) {
		return nil, nil, false
	}
	return cs.f, cs.msgs, true
}

// chatSplit is a chat body split by splitChat, with where its messages lie
// (for the chat memo).
type chatSplit struct {
	f    fields
	msgs []splitMessage
	// Set when messages appeared once, as an array of objects: the fields
	// before it, the offset of its value, and the end of its last message
	// (0 when it holds none).
	before  fields
	msgsAt  int
	lastEnd int
	once    bool
}

func (cs *chatSplit) split(b []byte) bool {
	var parsed []splitMessage
	seen := 0
	messages := func(key string, b []byte, i int) int {
		if key == "messages" {
			cs.msgs = nil // a repeated key: the last one's value counts
			seen++
		}
		if key != "messages" || i >= len(b) || b[i] != '[' {
			return scanValue(b, i, 1)
		}
		parsed = parsed[:0]
		last := 0
		end := scanArrayWith(b, i, 1, func(b []byte, i int) int {
			m, end := splitMessageAt(b, i)
			if end >= 0 {
				parsed = append(parsed, m)
				last = end
			}
			return end
		})
		if end >= 0 {
			cs.msgs, cs.msgsAt, cs.lastEnd = parsed, i, last
			parsed = nil
		}
		return end
	}
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipSpace(b, i+1)
	cs.f = make(fields, 8)
	end := i + 1
	if i >= len(b) || b[i] != '}' {
		// The fields before messages, for the memo: the key is found before
		// its value is scanned, so they are copied then (a few small ones).
		end = objectFields(b, i, 0, cs.f, func(key string, b []byte, i int) int {
			if key == "messages" && seen == 0 {
				cs.before = maps.Clone(cs.f)
			}
			return messages(key, b, i)
		})
	}
	if end < 0 || skipSpace(b, end) != len(b) {
		cs.f, cs.msgs = nil, nil
		return false
	}
	cs.once = seen == 1 && cs.msgs != nil
	return true
}

// splitMessageAt splits the chat message at b[i], reading a plain string
// content in the same pass; it returns the message and its end, or -1.
func splitMessageAt(b []byte, i int) (m splitMessage, end int) {
	if i >= len(b) || b[i] != '{' {
		return m, -1 // not an object: the general path words the error
	}
	f, end := splitObjectAt(b, i, 2, func(key string, b []byte, i int) int {
		if key == "content" {
			m.content, m.contentOK = "", false
		}
		if key != "content" || i >= len(b) || b[i] != '"' {
			return scanValue(b, i, 3)
		}
		end, plain := scanString(b, i)
		if end >= 0 && plain {
			m.content, m.contentOK = string(b[i+1:end-1]), true
		}
		return end
	})
	m.f = f
	return m, end
}

// scanArrayWith scans the array at b[i] (depth its nesting), scanning each
// element with elem (which returns its end, or -1); it returns the array's
// end, or -1.
func scanArrayWith(b []byte, i, depth int, elem func(b []byte, i int) int) int {
	if i >= len(b) || b[i] != '[' || depth >= scanMaxDepth {
		return -1
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return i + 1
	}
	if i = elem(b, i); i < 0 {
		return -1
	}
	return arrayRest(b, i, elem)
}

// arrayRest scans an array's elements after the one that ended at b[i]
// and returns the array's end, or -1.
func arrayRest(b []byte, i int, elem func(b []byte, i int) int) int {
	for {
		i = skipSpace(b, i)
		if i >= len(b) {
			return -1
		}
		if b[i] == ']' {
			return i + 1
		}
		if b[i] != ',' {
			return -1
		}
		if i = elem(b, skipSpace(b, i+1)); i < 0 {
			return -1
		}
	}
}

// splitArray splits a JSON array into its elements; ok as for splitObject.
func splitArray(b []byte) (items []json.RawMessage, ok bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '[' {
		return nil, false
	}
	i = skipSpace(b, i+1)
	items = []json.RawMessage{}
	if i < len(b) && b[i] == ']' {
		return items, skipSpace(b, i+1) == len(b)
	}
	for {
		end := scanValue(b, i, 1)
		if end < 0 {
			return nil, false
		}
		items = append(items, json.RawMessage(b[i:end:end]))
		i = skipSpace(b, end)
		if i >= len(b) {
			return nil, false
		}
		if b[i] == ']' {
			return items, skipSpace(b, i+1) == len(b)
		}
		if b[i] != ',' {
			return nil, false
		}
		i = skipSpace(b, i+1)
	}
}

// plainString returns the value of a JSON string with no escapes and valid
// UTF-8 (b may have surrounding whitespace); ok is false for anything else.
func plainString(b []byte) (string, bool) {
	b = b[skipSpace(b, 0):]
	for len(b) > 0 && isJSONSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	if len(b) < 2 || b[0] != '"' {
		return "", false
	}
	end, plain := scanString(b, 0)
	if end != len(b) || !plain {
		return "", false
	}
	return string(b[1 : len(b)-1]), true
}

// internKey returns the parameter names requests carry as constants, so a
// map key is not an allocation per field per request.
func internKey(b []byte) string {
	switch string(b) {
	case "model":
		return "model"
	case "messages":
		return "messages"
	case "role":
		return "role"
	case "content":
		return "content"
	case "name":
		return "name"
	case "prompt":
		return "prompt"
	case "stream":
		return "stream"
	case "stream_options":
		return "stream_options"
	case "include_usage":
		return "include_usage"
	case "max_tokens":
		return "max_tokens"
	case "max_completion_tokens":
		return "max_completion_tokens"
	case "temperature":
		return "temperature"
	case "top_p":
		return "top_p"
	case "seed":
		return "seed"
	case "stop":
		return "stop"
	case "user":
		return "user"
	case "type":
		return "type"
	case "text":
		return "text"
	}
	return string(b)
}
