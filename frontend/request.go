package frontend

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
)

// Message is one chat message after validation; content is plain text.
type Message struct {
	Role    string
	Content string
	Name    string
}

// genParams are the sampling and length parameters both endpoints share.
type genParams struct {
	MaxTokens    int // 0: until the context or the default limit
	Temperature  float64
	TopP         float64
	Seed         uint64
	HasSeed      bool
	Stop         []string
	Stream       bool
	IncludeUsage bool
	User         string
}

// chatRequest is a validated POST /v1/chat/completions body.
type chatRequest struct {
	Model    string
	Messages []Message
	genParams
}

// completionRequest is a validated POST /v1/completions body. Exactly one of
// Texts and TokenPrompts is set; each entry is one prompt (one choice).
type completionRequest struct {
	Model        string
	Texts        []string
	TokenPrompts [][]uint32
	Echo         bool
	genParams
}

// fields is a JSON object read lazily, field by field, so every error can
// name its parameter. Fields we do not know — including kv_hint,
// kv_transfer_params, nvext and other routing annotations — are never read,
// which is how client-supplied routing hints are stripped.
type fields map[string]json.RawMessage

func parseObject(body []byte) (fields, *apiError) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return nil, invalid("", "request body is empty; expected a JSON object")
	}
	if body[0] != '{' {
		return nil, invalid("", "request body must be a JSON object")
	}
	var f fields
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&f); err != nil {
		return nil, invalid("", "malformed JSON in request body: %v", err)
	}
	if dec.More() {
		return nil, invalid("", "malformed JSON in request body: unexpected data after the top-level object")
	}
	return f, nil
}

func (f fields) has(key string) bool {
	v, ok := f[key]
	return ok && !isNull(v)
}

func isNull(v json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(v), []byte("null")) }

func jsonKind(v json.RawMessage) string {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return "nothing"
	}
	switch v[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

func (f fields) str(key string) (string, *apiError) {
	v, ok := f[key]
	if !ok || isNull(v) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", invalid(key, "'%s' must be a string, got %s", key, jsonKind(v))
	}
	return s, nil
}

func (f fields) boolean(key string) (bool, *apiError) {
	v, ok := f[key]
	if !ok || isNull(v) {
		return false, nil
	}
	var b bool
	if err := json.Unmarshal(v, &b); err != nil {
		return false, invalid(key, "'%s' must be a boolean, got %s", key, jsonKind(v))
	}
	return b, nil
}

func (f fields) number(key string, lo, hi float64) (float64, bool, *apiError) {
	v, ok := f[key]
	if !ok || isNull(v) {
		return 0, false, nil
	}
	var x float64
	if err := json.Unmarshal(v, &x); err != nil {
		return 0, false, invalid(key, "'%s' must be a number, got %s", key, jsonKind(v))
	}
	if x < lo || x > hi || math.IsNaN(x) {
		return 0, false, invalid(key, "'%s' must be between %g and %g, got %g", key, lo, hi, x)
	}
	return x, true, nil
}

func (f fields) integer(key string, lo, hi int64) (int64, bool, *apiError) {
	v, ok := f[key]
	if !ok || isNull(v) {
		return 0, false, nil
	}
	var n json.Number
	if err := json.Unmarshal(v, &n); err != nil {
		return 0, false, invalid(key, "'%s' must be an integer, got %s", key, jsonKind(v))
	}
	i, err := n.Int64()
	if err != nil {
		return 0, false, invalid(key, "'%s' must be an integer, got %s", key, n)
	}
	if i < lo || i > hi {
		return 0, false, invalid(key, "'%s' must be between %d and %d, got %d", key, lo, hi, i)
	}
	return i, true, nil
}

// maxStops mirrors OpenAI's limit on stop sequences.
const maxStops = 4

func (f fields) genParams() (genParams, *apiError) {
	var p genParams
	var e *apiError
	if mt, ok, err := f.integer("max_completion_tokens", 1, math.MaxInt32); err != nil {
		return p, err
	} else if ok {
		p.MaxTokens = int(mt)
	} else if mt, ok, err := f.integer("max_tokens", 1, math.MaxInt32); err != nil {
		return p, err
	} else if ok {
		p.MaxTokens = int(mt)
	}
	p.Temperature = 1
	if t, ok, err := f.number("temperature", 0, 2); err != nil {
		return p, err
	} else if ok {
		p.Temperature = t
	}
	p.TopP = 1
	if t, ok, err := f.number("top_p", 0, 1); err != nil {
		return p, err
	} else if ok {
		if t == 0 {
			return p, invalid("top_p", "'top_p' must be greater than 0, got 0")
		}
		p.TopP = t
	}
	if s, ok, err := f.integer("seed", math.MinInt64, math.MaxInt64); err != nil {
		return p, err
	} else if ok {
		p.Seed, p.HasSeed = uint64(s), true
	}
	if n, ok, err := f.integer("n", 1, math.MaxInt32); err != nil {
		return p, err
	} else if ok && n != 1 {
		return p, invalid("n", "'n' must be 1: generating %d choices per request is not supported", n)
	}
	if p.Stop, e = f.stops(); e != nil {
		return p, e
	}
	if p.Stream, e = f.boolean("stream"); e != nil {
		return p, e
	}
	if v, ok := f["stream_options"]; ok && !isNull(v) {
		if !p.Stream {
			return p, invalid("stream_options", "'stream_options' is only allowed when 'stream' is true")
		}
		so, err := parseObject(v)
		if err != nil {
			return p, invalid("stream_options", "'stream_options' must be an object, got %s", jsonKind(v))
		}
		if p.IncludeUsage, e = so.boolean("include_usage"); e != nil {
			e.Param = strPtr("stream_options.include_usage")
			e.Message = strings.Replace(e.Message, "'include_usage'", "'stream_options.include_usage'", 1)
			return p, e
		}
	}
	if p.User, e = f.str("user"); e != nil {
		return p, e
	}
	return p, nil
}

func strPtr(s string) *string { return &s }

func (f fields) stops() ([]string, *apiError) {
	v, ok := f["stop"]
	if !ok || isNull(v) {
		return nil, nil
	}
	var one string
	if json.Unmarshal(v, &one) == nil {
		if one == "" {
			return nil, nil
		}
		return []string{one}, nil
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(v, &raw); err != nil {
		return nil, invalid("stop", "'stop' must be a string or an array of strings, got %s", jsonKind(v))
	}
	if len(raw) > maxStops {
		return nil, invalid("stop", "'stop' may hold at most %d sequences, got %d", maxStops, len(raw))
	}
	var out []string
	for i, r := range raw {
		var s string
		if err := json.Unmarshal(r, &s); err != nil {
			return nil, invalid("stop", "'stop[%d]' must be a string, got %s", i, jsonKind(r))
		}
		if s != "" {
			out = append(out, s)
		}
	}
	return out, nil
}

func (f fields) model() (string, *apiError) {
	if !f.has("model") {
		return "", invalid("model", "'model' is required")
	}
	m, err := f.str("model")
	if err != nil {
		return "", err
	}
	if m == "" {
		return "", invalid("model", "'model' must not be empty")
	}
	return m, nil
}

var chatRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true}

func parseChat(body []byte) (*chatRequest, *apiError) {
	f, err := parseObject(body)
	if err != nil {
		return nil, err
	}
	r := &chatRequest{}
	if r.Model, err = f.model(); err != nil {
		return nil, err
	}
	v, ok := f["messages"]
	if !ok || isNull(v) {
		return nil, invalid("messages", "'messages' is required")
	}
	var raw []json.RawMessage
	if e := json.Unmarshal(v, &raw); e != nil {
		return nil, invalid("messages", "'messages' must be an array, got %s", jsonKind(v))
	}
	if len(raw) == 0 {
		return nil, invalid("messages", "'messages' must hold at least one message")
	}
	for i, m := range raw {
		msg, err := parseMessage(i, m)
		if err != nil {
			return nil, err
		}
		r.Messages = append(r.Messages, msg)
	}
	if r.genParams, err = f.genParams(); err != nil {
		return nil, err
	}
	return r, nil
}

func parseMessage(i int, raw json.RawMessage) (Message, *apiError) {
	at := fmt.Sprintf("messages[%d]", i)
	m, err := parseObject(raw)
	if err != nil {
		return Message{}, invalid(at, "'%s' must be an object, got %s", at, jsonKind(raw))
	}
	var msg Message
	role, err := m.str("role")
	if err != nil || role == "" {
		return msg, invalid(at+".role", "'%s.role' is required and must be one of system, developer, user, assistant, tool", at)
	}
	if !chatRoles[role] {
		return msg, invalid(at+".role", "'%s.role' must be one of system, developer, user, assistant, tool; got %q", at, role)
	}
	msg.Role = role
	if msg.Name, err = m.str("name"); err != nil {
		return msg, invalid(at+".name", "'%s.name' must be a string", at)
	}
	c, ok := m["content"]
	switch {
	case !ok || isNull(c):
		// An assistant message may carry only tool calls.
		if role != "assistant" {
			return msg, invalid(at+".content", "'%s.content' is required for role %q", at, role)
		}
	default:
		text, err := parseContent(at+".content", c)
		if err != nil {
			return msg, err
		}
		msg.Content = text
	}
	return msg, nil
}

// parseContent accepts a string or an array of text parts.
func parseContent(at string, c json.RawMessage) (string, *apiError) {
	var s string
	if json.Unmarshal(c, &s) == nil {
		return s, nil
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(c, &parts); err != nil {
		return "", invalid(at, "'%s' must be a string or an array of content parts, got %s", at, jsonKind(c))
	}
	var b strings.Builder
	for j, p := range parts {
		pat := fmt.Sprintf("%s[%d]", at, j)
		pf, err := parseObject(p)
		if err != nil {
			return "", invalid(pat, "'%s' must be an object, got %s", pat, jsonKind(p))
		}
		typ, err := pf.str("type")
		if err != nil {
			return "", invalid(pat+".type", "'%s.type' must be a string", pat)
		}
		if typ != "text" {
			return "", invalid(pat+".type", "'%s.type' %q is not supported: this model accepts text parts only", pat, typ)
		}
		if !pf.has("text") {
			return "", invalid(pat+".text", "'%s.text' is required", pat)
		}
		t, err := pf.str("text")
		if err != nil {
			return "", invalid(pat+".text", "'%s.text' must be a string", pat)
		}
		b.WriteString(t)
	}
	return b.String(), nil
}

func parseCompletion(body []byte) (*completionRequest, *apiError) {
	f, err := parseObject(body)
	if err != nil {
		return nil, err
	}
	r := &completionRequest{}
	if r.Model, err = f.model(); err != nil {
		return nil, err
	}
	v, ok := f["prompt"]
	if !ok || isNull(v) {
		return nil, invalid("prompt", "'prompt' is required")
	}
	if err := r.parsePrompt(v); err != nil {
		return nil, err
	}
	if r.Echo, err = f.boolean("echo"); err != nil {
		return nil, err
	}
	if r.genParams, err = f.genParams(); err != nil {
		return nil, err
	}
	if n := len(r.Texts) + len(r.TokenPrompts); n > 1 && r.Stream {
		return nil, invalid("prompt", "streaming supports a single prompt, got %d", n)
	}
	return r, nil
}

// maxPrompts bounds a batch of prompts in one completion request.
const maxPrompts = 64

// parsePrompt accepts a string, an array of strings, an array of token ids,
// or an array of arrays of token ids.
func (r *completionRequest) parsePrompt(v json.RawMessage) *apiError {
	var s string
	if json.Unmarshal(v, &s) == nil {
		r.Texts = []string{s}
		return nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(v, &items); err != nil {
		return invalid("prompt", "'prompt' must be a string, an array of strings, or an array of token ids, got %s", jsonKind(v))
	}
	if len(items) == 0 {
		return invalid("prompt", "'prompt' must not be an empty array")
	}
	switch jsonKind(items[0]) {
	case "a string":
		if len(items) > maxPrompts {
			return invalid("prompt", "'prompt' may hold at most %d prompts, got %d", maxPrompts, len(items))
		}
		for i, it := range items {
			var t string
			if err := json.Unmarshal(it, &t); err != nil {
				return invalid("prompt", "'prompt[%d]' must be a string like the first element, got %s", i, jsonKind(it))
			}
			r.Texts = append(r.Texts, t)
		}
	case "a number":
		ids, err := tokenIDs("prompt", items)
		if err != nil {
			return err
		}
		r.TokenPrompts = [][]uint32{ids}
	case "an array":
		if len(items) > maxPrompts {
			return invalid("prompt", "'prompt' may hold at most %d prompts, got %d", maxPrompts, len(items))
		}
		for i, it := range items {
			var inner []json.RawMessage
			if err := json.Unmarshal(it, &inner); err != nil {
				return invalid("prompt", "'prompt[%d]' must be an array of token ids, got %s", i, jsonKind(it))
			}
			if len(inner) == 0 {
				return invalid("prompt", "'prompt[%d]' must not be empty", i)
			}
			ids, err := tokenIDs(fmt.Sprintf("prompt[%d]", i), inner)
			if err != nil {
				return err
			}
			r.TokenPrompts = append(r.TokenPrompts, ids)
		}
	default:
		return invalid("prompt", "'prompt[0]' must be a string, a token id or an array of token ids, got %s", jsonKind(items[0]))
	}
	return nil
}

func tokenIDs(at string, items []json.RawMessage) ([]uint32, *apiError) {
	ids := make([]uint32, len(items))
	for i, it := range items {
		var n json.Number
		if err := json.Unmarshal(it, &n); err != nil {
			return nil, invalid("prompt", "'%s[%d]' must be a token id (an integer), got %s", at, i, jsonKind(it))
		}
		x, err := n.Int64()
		if err != nil || x < 0 || x > math.MaxUint32 {
			return nil, invalid("prompt", "'%s[%d]' must be a token id in [0, %d], got %s", at, i, uint32(math.MaxUint32), n)
		}
		ids[i] = uint32(x)
	}
	return ids, nil
}
