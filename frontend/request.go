package frontend

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/tokenizer"
)

// Message is one chat message after validation; content is plain text.
type Message struct {
	Role    string
	Content string
	Name    string
}

// genParams are the sampling and length parameters both endpoints share.
type genParams struct {
	// Sampling as the client set it; MaxTokens 0: until the context or the
	// default limit. Seed is meaningful with HasSeed only.
	kv.Sampling
	HasSeed      bool
	Stop         []string
	Stream       bool
	IncludeUsage bool
	User         string
	// CacheSalt is vLLM's cache_salt: requests share cached KV blocks only
	// with requests of the same salt (it seeds their block hashes).
	CacheSalt string
	// maxTokensParam names the parameter that set MaxTokens ("" if none)
	// and promptParam the prompt ("messages" or "prompt"), for errors.
	maxTokensParam string
	promptParam    string
}

// chatRequest is a validated POST /v1/chat/completions body.
type chatRequest struct {
	Model    string
	Messages []Message
	genParams

	// For the chat memo (chatmemo.go): the body (trimmed) and where its
	// messages lie (split.once false: it is not kept), the entry its parse
	// continued (nil: none) and the body's keys.
	body  []byte
	split chatSplit
	memo  *memoEntry
	keys  memoKeys
	// scan is the prefix cache's scan of the prompt at the end of its
	// messages (encodeChat's), for keepAnswer.
	scan *tokenizer.CutScan
	// hashes are the block hashes its tokens carry to routing
	// (encodeChat's; nil: none).
	hashes *kv.PromptHashes
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
	if f, ok := splitObject(body); ok {
		return f, nil
	}
	var f fields
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&f); err != nil {
		return nil, invalid("", "malformed JSON in request body: %v", err)
	}
	// Not dec.More: it is false before a stray '}' or ']'.
	if len(bytes.TrimSpace(body[dec.InputOffset():])) > 0 {
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
	if s, ok := plainString(v); ok {
		return s, nil
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", typeError(key, "a string", v)
	}
	return s, nil
}

func (f fields) boolean(key string) (bool, *apiError) {
	v, ok := f[key]
	if !ok || isNull(v) {
		return false, nil
	}
	switch string(bytes.TrimSpace(v)) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, typeError(key, "a boolean", v)
}

// number reads a JSON number (never a string holding one) in [lo, hi].
func (f fields) number(key string, lo, hi float64) (float64, bool, *apiError) {
	v, ok := f[key]
	if !ok || isNull(v) {
		return 0, false, nil
	}
	v = bytes.TrimSpace(v)
	if jsonKind(v) != "a number" {
		return 0, false, typeError(key, "a number", v)
	}
	x, err := strconv.ParseFloat(string(v), 64)
	if err != nil || x < lo || x > hi || math.IsNaN(x) {
		return 0, false, invalid(key, "'%s' must be between %g and %g, got %s", key, lo, hi, v)
	}
	return x, true, nil
}

func (f fields) integer(key string, lo, hi int64) (int64, bool, *apiError) {
	v, ok := f[key]
	if !ok || isNull(v) {
		return 0, false, nil
	}
	i, err := parseInt(key, v, lo, hi)
	return i, err == nil, err
}

// parseInt reads a JSON integer in [lo, hi]: a quoted number is a string,
// 1.5 is not an integer, and 2^63 is out of range (not "not an integer").
// An integral exponent form such as 1e3 is accepted, as JSON means it.
func parseInt(param string, v json.RawMessage, lo, hi int64) (int64, *apiError) {
	v = bytes.TrimSpace(v)
	if jsonKind(v) != "a number" {
		return 0, typeError(param, "an integer", v)
	}
	i, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		x, ferr := strconv.ParseFloat(string(v), 64)
		switch {
		case errors.Is(err, strconv.ErrRange) || errors.Is(ferr, strconv.ErrRange):
			return 0, invalid(param, "'%s' must be between %d and %d, got %s", param, lo, hi, v)
		case ferr != nil || x != math.Trunc(x):
			return 0, withCode(invalid(param, "Invalid type for '%s': expected an integer, but got a decimal number (%s) instead.", param, v), "invalid_type")
		case x < float64(lo) || x > float64(hi) || math.Abs(x) >= 1<<53:
			return 0, invalid(param, "'%s' must be between %d and %d, got %s", param, lo, hi, v)
		}
		i = int64(x)
	}
	if i < lo || i > hi {
		return 0, invalid(param, "'%s' must be between %d and %d, got %d", param, lo, hi, i)
	}
	return i, nil
}

// maxStops mirrors OpenAI's limit on stop sequences.
const maxStops = 4

func (f fields) genParams(chat bool) (genParams, *apiError) {
	var p genParams
	var e *apiError
	p.promptParam = "prompt"
	if chat {
		p.promptParam = "messages"
	}
	if mt, ok, err := f.integer("max_completion_tokens", 1, math.MaxInt32); err != nil {
		return p, err
	} else if ok {
		p.MaxTokens, p.maxTokensParam = int(mt), "max_completion_tokens"
	} else if mt, ok, err := f.integer("max_tokens", 1, math.MaxInt32); err != nil {
		return p, err
	} else if ok {
		p.MaxTokens, p.maxTokensParam = int(mt), "max_tokens"
	}
	if mt, ok, err := f.integer("min_tokens", 0, math.MaxInt32); err != nil {
		return p, err
	} else if ok && mt > 0 {
		if p.MaxTokens > 0 && int(mt) > p.MaxTokens {
			return p, invalid("min_tokens", "'min_tokens' (%d) must not exceed '%s' (%d)", mt, p.maxTokensParam, p.MaxTokens)
		}
		p.MinTokens = int(mt)
	}
	// vLLM's extension, which load generators send to fix output lengths.
	if p.IgnoreEOS, e = f.boolean("ignore_eos"); e != nil {
		return p, e
	}
	p.Temperature = 1
	if t, ok, err := f.number("temperature", 0, 2); err != nil {
		return p, err
	} else if ok {
		p.Temperature = t
	}
	if t, ok, err := f.number("top_p", 0, 1); err != nil {
		return p, err
	} else if ok {
		if t == 0 {
			return p, invalid("top_p", "'top_p' must be greater than 0, got 0")
		}
		p.TopP = t
	}
	// Penalties are sampling parameters like temperature: validated and
	// accepted (the simulated engine samples no distribution).
	if p.PresencePenalty, _, e = f.number("presence_penalty", -2, 2); e != nil {
		return p, e
	}
	if p.FrequencyPenalty, _, e = f.number("frequency_penalty", -2, 2); e != nil {
		return p, e
	}
	if err := f.logitBias(); err != nil {
		return p, err
	}
	if s, ok, err := f.integer("seed", math.MinInt64, math.MaxInt64); err != nil {
		return p, err
	} else if ok {
		p.Seed, p.HasSeed = uint64(s), true
	}
	n := int64(1)
	if x, ok, err := f.integer("n", 1, 128); err != nil {
		return p, err
	} else if ok && x != 1 {
		return p, unsupported("n", "'n' must be 1: generating %d choices per request is not supported", x)
	} else if ok {
		n = x
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
			return p, typeError("stream_options", "an object", v)
		}
		if p.IncludeUsage, e = so.boolean("include_usage"); e != nil {
			return p, typeError("stream_options.include_usage", "a boolean", so["include_usage"])
		}
		if _, e = so.boolean("include_obfuscation"); e != nil {
			return p, typeError("stream_options.include_obfuscation", "a boolean", so["include_obfuscation"])
		}
	}
	if p.User, e = f.str("user"); e != nil {
		return p, e
	}
	if p.CacheSalt, e = f.cacheSalt(); e != nil {
		return p, e
	}
	if chat {
		return p, f.chatOnly()
	}
	return p, f.completionOnly(n)
}

// logitBias validates logit_bias: an object of token ids to biases in
// [-100, 100]. Biasing tokens is not implemented, so a non-empty one is an
// error rather than ignored (a bias of -100 is a ban clients rely on).
func (f fields) logitBias() *apiError {
	v, ok := f["logit_bias"]
	if !ok || isNull(v) {
		return nil
	}
	lb, err := parseObject(v)
	if err != nil {
		return typeError("logit_bias", "an object", v)
	}
	for k := range lb {
		if _, err := strconv.ParseUint(k, 10, 32); err != nil {
			return invalid("logit_bias", "'logit_bias' keys must be token ids, got %q", k)
		}
		if _, _, err := lb.number(k, -100, 100); err != nil {
			err.Param = strPtr("logit_bias")
			return err
		}
	}
	if len(lb) > 0 {
		return unsupported("logit_bias", "'logit_bias' is not supported: token biases are not applied")
	}
	return nil
}

// chatOnly checks the chat parameters kvmesh validates but does not act on:
// defaults and no-ops pass, a request for a missing feature is a 400.
func (f fields) chatOnly() *apiError {
	logprobs, err := f.boolean("logprobs")
	if err != nil {
		return err
	}
	if logprobs {
		return unsupported("logprobs", "'logprobs': true is not supported: log probabilities are not returned")
	}
	if _, ok, err := f.integer("top_logprobs", 0, 20); err != nil {
		return err
	} else if ok {
		return invalid("top_logprobs", "'top_logprobs' requires 'logprobs' to be true")
	}
	for _, k := range []string{"parallel_tool_calls", "store"} {
		if _, err := f.boolean(k); err != nil {
			return err
		}
	}
	for _, k := range []string{"service_tier", "prompt_cache_key", "safety_identifier"} {
		if _, err := f.str(k); err != nil {
			return err
		}
	}
	if v, ok := f["metadata"]; ok && !isNull(v) {
		if _, err := parseObject(v); err != nil {
			return typeError("metadata", "an object", v)
		}
	}
	if err := f.tools(); err != nil {
		return err
	}
	if v, ok := f["response_format"]; ok && !isNull(v) {
		rf, err := parseObject(v)
		if err != nil {
			return typeError("response_format", "an object", v)
		}
		t, err := rf.str("type")
		if err != nil {
			return typeError("response_format.type", "a string", rf["type"])
		}
		switch t {
		case "text":
		case "json_object", "json_schema":
			return unsupported("response_format", "'response_format' of type '%s' is not supported: output is not constrained; only 'text' is", t)
		default:
			return invalid("response_format.type", "'response_format.type' must be one of text, json_object, json_schema; got %q", t)
		}
	}
	if v, ok := f["modalities"]; ok && !isNull(v) {
		var ms []string
		if json.Unmarshal(v, &ms) != nil {
			return typeError("modalities", "an array of strings", v)
		}
		for _, m := range ms {
			if m != "text" {
				return unsupported("modalities", "'modalities' %q is not supported: only text is", m)
			}
		}
	}
	for _, k := range []string{"audio", "prediction", "web_search_options", "reasoning_effort"} {
		if f.has(k) {
			return unsupported(k, "'%s' is not supported by this model", k)
		}
	}
	return nil
}

// tools accepts tool definitions only where no tool may be called
// (tool_choice "none"); calling tools is not implemented.
func (f fields) tools() *apiError {
	choice := `"auto"` // as shown in errors
	if v, ok := f["tool_choice"]; ok && !isNull(v) {
		var s string
		switch {
		case json.Unmarshal(v, &s) == nil:
			if s != "none" && s != "auto" && s != "required" {
				return invalid("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or an object naming a tool; got %q", s)
			}
			choice = strconv.Quote(s)
		case jsonKind(v) == "an object":
			choice = "naming a tool"
		default:
			return typeError("tool_choice", "a string or an object", v)
		}
	}
	n := 0
	if v, ok := f["tools"]; ok && !isNull(v) {
		var ts []json.RawMessage
		if json.Unmarshal(v, &ts) != nil {
			return typeError("tools", "an array", v)
		}
		n = len(ts)
	}
	if v, ok := f["functions"]; ok && !isNull(v) {
		var fs []json.RawMessage
		if json.Unmarshal(v, &fs) != nil {
			return typeError("functions", "an array", v)
		}
		if len(fs) > 0 {
			return unsupported("functions", "'functions' is not supported: this server does not call tools")
		}
	}
	if v, ok := f["function_call"]; ok && !isNull(v) {
		var s string
		if json.Unmarshal(v, &s) != nil || s != "none" && s != "auto" {
			return unsupported("function_call", "'function_call' is not supported: this server does not call tools")
		}
	}
	switch {
	case n > 0 && choice != `"none"`:
		return unsupported("tools", "'tools' with 'tool_choice' %s is not supported: this server does not call tools (only tool_choice \"none\" is accepted)", choice)
	case n == 0 && choice != `"none"` && choice != `"auto"`:
		return invalid("tool_choice", "'tool_choice' %s is only allowed when 'tools' are specified", choice)
	}
	return nil
}

// completionOnly checks the legacy completion parameters.
func (f fields) completionOnly(n int64) *apiError {
	if lp, ok, err := f.integer("logprobs", 0, 5); err != nil {
		return err
	} else if ok {
		return unsupported("logprobs", "'logprobs' (%d) is not supported: log probabilities are not returned", lp)
	}
	if b, ok, err := f.integer("best_of", 1, 20); err != nil {
		return err
	} else if ok && b < n {
		return invalid("best_of", "'best_of' (%d) must be at least 'n' (%d)", b, n)
	} else if ok && b > 1 {
		return unsupported("best_of", "'best_of' %d is not supported: one candidate is generated per choice", b)
	}
	if s, err := f.str("suffix"); err != nil {
		return err
	} else if s != "" {
		return unsupported("suffix", "'suffix' is not supported: text is generated only after the prompt")
	}
	return nil
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

// maxCacheSalt bounds a cache salt: it names a tenant, not a payload.
const maxCacheSalt = 1024

// cacheSalt reads cache_salt as vLLM accepts it: absent or null for none,
// else a non-empty string.
func (f fields) cacheSalt() (string, *apiError) {
	if !f.has("cache_salt") {
		return "", nil
	}
	s, e := f.str("cache_salt")
	switch {
	case e != nil:
		return "", e
	case s == "":
		return "", invalid("cache_salt", "Parameter 'cache_salt' must be a non-empty string if provided.")
	case len(s) > maxCacheSalt:
		return "", invalid("cache_salt", "'cache_salt' is %d bytes long, limit %d", len(s), maxCacheSalt)
	}
	return s, nil
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

func parseChat(body []byte) (*chatRequest, *apiError) { return parseChatWith(body, true) }

// parseChatWith is parseChat; split false takes the general path only (the
// tests hold the two to the same answers).
func parseChatWith(body []byte, split bool) (*chatRequest, *apiError) {
	var f fields
	var msgs []splitMessage
	var cs chatSplit
	ok := false
	if split {
		ok = cs.split(bytes.TrimSpace(body))
		f, msgs = cs.f, cs.msgs
	}
	if !ok || msgs == nil {
		// The general path, which also words every error.
		var err *apiError
		if f, err = parseObject(body); err != nil {
			return nil, err
		}
		msgs = nil
	}
	r := &chatRequest{}
	var err *apiError
	if r.Model, err = f.model(); err != nil {
		return nil, err
	}
	if msgs == nil {
		v, ok := f["messages"]
		if !ok || isNull(v) {
			return nil, invalid("messages", "'messages' is required")
		}
		raw, ok := splitArray(v)
		if !ok {
			if e := json.Unmarshal(v, &raw); e != nil {
				return nil, invalid("messages", "'messages' must be an array, got %s", jsonKind(v))
			}
		}
		msgs = make([]splitMessage, len(raw))
		for i, m := range raw {
			msgs[i].raw = m
		}
	}
	if len(msgs) == 0 {
		return nil, invalid("messages", "'messages' must hold at least one message")
	}
	r.Messages = make([]Message, 0, len(msgs))
	for i, m := range msgs {
		msg, err := parseMessage(i, m)
		if err != nil {
			return nil, err
		}
		r.Messages = append(r.Messages, msg)
	}
	if r.genParams, err = f.genParams(true); err != nil {
		return nil, err
	}
	if ok && cs.once {
		r.split = cs
	}
	return r, nil
}

// parseMessage validates one message's fields; sm.content is its content
// when the split already read it as a plain string.
func parseMessage(i int, sm splitMessage) (Message, *apiError) {
	at := "messages[" + strconv.Itoa(i) + "]"
	m := sm.f
	if m == nil {
		var err *apiError
		if m, err = parseObject(sm.raw); err != nil {
			return Message{}, invalid(at, "'%s' must be an object, got %s", at, jsonKind(sm.raw))
		}
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
	if role == "tool" {
		id, err := m.str("tool_call_id")
		if err != nil || id == "" {
			return msg, invalid(at+".tool_call_id", "Missing parameter 'tool_call_id': '%s' has role \"tool\" and must name the tool call it answers", at)
		}
	}
	c, ok := m["content"]
	switch {
	case !ok || isNull(c):
		// An assistant message may carry only tool calls.
		if role != "assistant" {
			return msg, invalid(at+".content", "'%s.content' is required for role %q", at, role)
		}
	case sm.contentOK:
		msg.Content = sm.content
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
	if s, ok := plainString(c); ok {
		return s, nil
	}
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
	if r.genParams, err = f.genParams(false); err != nil {
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
		it = bytes.TrimSpace(it)
		x, err := strconv.ParseUint(string(it), 10, 32)
		if err != nil {
			if jsonKind(it) != "a number" {
				return nil, invalid("prompt", "'%s[%d]' must be a token id (an integer), got %s", at, i, jsonKind(it))
			}
			return nil, invalid("prompt", "'%s[%d]' must be a token id in [0, %d], got %s", at, i, uint32(math.MaxUint32), it)
		}
		ids[i] = uint32(x)
	}
	return ids, nil
}
