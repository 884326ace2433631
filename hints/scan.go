package hints

import (
	"encoding/json"
	"errors"
	"fmt"
)

// A trusted splitter for JSON that encoding/json has already validated once.
// Going through json.Unmarshal at every nesting level re-validates the inner
// values each time (the block hash list five times over); splitting by hand
// keeps Parse to a single validating pass. Every index is bounds-checked, so
// even unvalidated input cannot make it panic, only fail.

var errScan = errors.New("truncated JSON")

// errDuplicateKey: an object names a key twice.
var errDuplicateKey = errors.New("duplicate key")

// skipValue returns the index just past the value starting at b[i].
func skipValue(b []byte, i int) (int, error) {
	if i >= len(b) {
		return 0, errScan
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				j, err := skipString(b, i)
				if err != nil {
					return 0, err
				}
				i = j
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1, nil
				}
			}
			i++
		}
		return 0, errScan
	default: // number, true, false, null
		j := i
		for j < len(b) && !isDelim(b[j]) {
			j++
		}
		if j == i {
			return 0, errScan
		}
		return j, nil
	}
}

func skipString(b []byte, i int) (int, error) {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1, nil
		}
	}
	return 0, errScan
}

func isDelim(c byte) bool {
	return c == ',' || c == ']' || c == '}' || c == ' ' || c == '\t' || c == '\n' || c == '\r'
}

// splitList returns the raw elements of a JSON list.
func splitList(b []byte) ([]json.RawMessage, error) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '[' {
		return nil, errScan
	}
	var out []json.RawMessage
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return out, nil
	}
	for {
		j, err := skipValue(b, i)
		if err != nil {
			return nil, err
		}
		out = append(out, b[i:j:j])
		i = skipSpace(b, j)
		if i >= len(b) {
			return nil, errScan
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case ']':
			return out, nil
		default:
			return nil, errScan
		}
	}
}

// splitObject returns a JSON object's members, keys decoded exactly as
// encoding/json would (escapes resolved, invalid UTF-8 replaced); a repeated
// key keeps its last value.
func splitObject(b []byte) (map[string]json.RawMessage, error) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, errScan
	}
	out := make(map[string]json.RawMessage)
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return out, nil
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return nil, errScan
		}
		j, err := skipString(b, i)
		if err != nil {
			return nil, err
		}
		key, err := decodeKey(b[i:j])
		if err != nil {
			return nil, err
		}
		i = skipSpace(b, j)
		if i >= len(b) || b[i] != ':' {
			return nil, errScan
		}
		i = skipSpace(b, i+1)
		j, err = skipValue(b, i)
		if err != nil {
			return nil, err
		}
		if _, dup := out[key]; dup {
			// Two parsers may keep different copies; a hint must mean one thing.
			return nil, fmt.Errorf("%w %q", errDuplicateKey, clip(key))
		}
		out[key] = b[i:j:j]
		i = skipSpace(b, j)
		if i >= len(b) {
			return nil, errScan
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return out, nil
		default:
			return nil, errScan
		}
	}
}

// decodeKey decodes a quoted JSON string; plain ASCII takes the fast path.
func decodeKey(q []byte) (string, error) {
	plain := true
	for _, c := range q[1 : len(q)-1] {
		if c == '\\' || c >= 0x80 || c < 0x20 {
			plain = false
			break
		}
	}
	if plain {
		return string(q[1 : len(q)-1]), nil
	}
	var s string
	err := json.Unmarshal(q, &s)
	return s, err
}
