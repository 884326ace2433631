package remote

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/kv"
)

// maxErrorBody bounds how much of an error response is read.
const maxErrorBody = 64 << 10

// WaitHealthy polls base+path until it answers 200 or ctx ends: a worker
// registers its engine only once the engine is serving.
func WaitHealthy(ctx context.Context, c *http.Client, url string) error {
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := c.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s", resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("engine not healthy at %s: %v (last: %v)", url, ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// GetJSON fetches url and decodes its JSON body into v.
func GetJSON(ctx context.Context, c *http.Client, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// Scrape fetches a Prometheus text exposition.
func Scrape(ctx context.Context, c *http.Client, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// Sample is one series' value and labels.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Samples lists a family's series (gauges, counters, untyped).
func Samples(fams map[string]*dto.MetricFamily, name string) []Sample {
	f := fams[name]
	if f == nil {
		return nil
	}
	out := make([]Sample, 0, len(f.Metric))
	for _, m := range f.Metric {
		s := Sample{Labels: make(map[string]string, len(m.Label))}
		for _, l := range m.Label {
			s.Labels[l.GetName()] = l.GetValue()
		}
		switch {
		case m.Gauge != nil:
			s.Value = m.Gauge.GetValue()
		case m.Counter != nil:
			s.Value = m.Counter.GetValue()
		case m.Untyped != nil:
			s.Value = m.Untyped.GetValue()
		default:
			continue
		}
		out = append(out, s)
	}
	return out
}

// RejectedError is an engine's 4xx: the request's fault. Its message is
// the engine's own, so the client reads what the engine said.
type RejectedError struct {
	Status  int
	Message string
}

func (e *RejectedError) Error() string { return e.Message }

// ResponseError classifies a non-2xx response (its body is read and
// closed): a 4xx is a *RejectedError, anything else wraps
// engine.ErrUnavailable.
func ResponseError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	resp.Body.Close()
	msg := ErrorMessage(body)
	if msg == "" {
		msg = resp.Status
	}
	if rejected(resp.StatusCode) {
		return &RejectedError{Status: resp.StatusCode, Message: msg}
	}
	return fmt.Errorf("%w: %s: %s", engine.ErrUnavailable, resp.Status, msg)
}

// rejected is the rule for an engine's status: a 4xx is the request's
// fault, except a timeout or a rate limit, which another engine may not
// have.
func rejected(status int) bool {
	return status >= 400 && status < 500 && status != http.StatusRequestTimeout && status != http.StatusTooManyRequests
}

// StreamError classifies an error object an engine sent inside a stream
// ({"message":…,"code":…}, the code a number or a numeric string) by
// ResponseError's rule; an object without a code is the engine's failure.
func StreamError(raw json.RawMessage) error {
	var inner struct {
		Message string `json:"message"`
		Code    any    `json:"code"`
	}
	if json.Unmarshal(raw, &inner) != nil || inner.Message == "" {
		inner.Message = ErrorMessage(raw)
	}
	return CodedError(inner.Message, inner.Code)
}

// CodedError is StreamError for a message and code already read.
func CodedError(msg string, code any) error {
	status := 0
	switch c := code.(type) {
	case float64:
		status = int(c)
	case string:
		status, _ = strconv.Atoi(c)
	}
	if rejected(status) {
		return &RejectedError{Status: status, Message: msg}
	}
	return Lost(fmt.Errorf("engine error: %s", msg))
}

// ErrorMessage reads the message of an OpenAI-shaped error body
// ({"error":{"message":…}}) or of vLLM's older flat one
// ({"object":"error","message":…}); "" when it is neither.
func ErrorMessage(body []byte) string {
	var e struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
	}
	if json.Unmarshal(body, &e) != nil {
		return strings.TrimSpace(string(bytes.ToValidUTF8(body[:min(len(body), 512)], nil)))
	}
	if len(e.Error) > 0 {
		var inner struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(e.Error, &inner) == nil && inner.Message != "" {
			return inner.Message
		}
		var s string
		if json.Unmarshal(e.Error, &s) == nil {
			return s
		}
	}
	return e.Message
}

// Lost wraps a transport failure (refused connection, reset, a stream cut
// short) as engine.ErrUnavailable.
func Lost(err error) error {
	if err == nil || errors.Is(err, engine.ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %v", engine.ErrUnavailable, err)
}

// SSE reads server-sent events: Next returns each event's data ("[DONE]"
// included) and io.EOF at the end of the stream.
type SSE struct {
	r    *bufio.Reader
	data []byte
}

// NewSSE reads events from r.
func NewSSE(r io.Reader) *SSE { return &SSE{r: bufio.NewReaderSize(r, 64<<10)} }

// Next returns the next event's data; the slice is valid until the next
// call.
func (s *SSE) Next() ([]byte, error) {
	s.data = s.data[:0]
	have := false
	for {
		line, err := s.r.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// A long line: gather it whole.
			buf := append([]byte(nil), line...)
			for err == bufio.ErrBufferFull {
				line, err = s.r.ReadSlice('\n')
				buf = append(buf, line...)
			}
			line = buf
		}
		if err != nil && len(line) == 0 {
			if err == io.EOF && have {
				return s.data, nil
			}
			return nil, err
		}
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case len(line) == 0:
			if have {
				return s.data, nil
			}
		case line[0] == ':':
		default:
			field, value, _ := bytes.Cut(line, []byte(":"))
			if string(field) == "data" {
				value = bytes.TrimPrefix(value, []byte(" "))
				if have {
					s.data = append(s.data, '\n')
				}
				s.data = append(s.data, value...)
				have = true
			}
		}
		if err != nil {
			if have {
				return s.data, nil
			}
			return nil, err
		}
	}
}

// CheckURL validates an engine base URL and returns it without a trailing
// slash.
func CheckURL(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("%q: want http://host:port", s)
	}
	if u.Host == "" {
		return "", fmt.Errorf("%q: no host", s)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("%q: a base URL takes no query or fragment", s)
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// ErrStopped is ReadFrames' answer when its caller went away: the stream's
// context ended, or a frame handler had no one left to send to.
var ErrStopped = errors.New("stream reader stopped")

// ReadFrames reads an engine's SSE stream of JSON frames up to [DONE],
// decoding each into a fresh T for frame. It returns nil at [DONE], or when
// the body ends after finished reports the generation over (a server may
// drop [DONE]); ErrStopped when ctx ended; frame's own error; and a lost
// engine for a frame that does not decode or a stream cut short.
func ReadFrames[T any](ctx context.Context, body io.Reader, finished func() bool, frame func(*T) error) error {
	return ReadFramesDropping(ctx, body, "", finished, frame)
}

// ReadFramesDropping is ReadFrames for frames that may carry an integer
// list under drop that T does not read: it is cut out before decoding
// (DropIntList), so a prompt's ids echoed back are not scanned twice.
func ReadFramesDropping[T any](ctx context.Context, body io.Reader, drop string, finished func() bool, frame func(*T) error) error {
	return ReadFramesPreset(ctx, body, drop, finished, nil, frame)
}

// ReadFramesPreset is ReadFramesDropping where preset prepares each
// frame's fresh value before its FrameDecoder runs (what it may leave out,
// say); a frame the decoder declines reaches frame decoded whole.
func ReadFramesPreset[T any](ctx context.Context, body io.Reader, drop string, finished func() bool, preset func(*T), frame func(*T) error) error {
	sse := NewSSE(body)
	for {
		data, err := sse.Next()
		if err != nil {
			switch {
			case ctx.Err() != nil:
				return ErrStopped
			case finished():
				return nil
			}
			return Lost(fmt.Errorf("stream ended early: %v", err))
		}
		if string(data) == "[DONE]" {
			return nil
		}
		if drop != "" {
			data = DropIntList(data, drop)
		}
		var f T
		if err := decodeFrame(data, &f, preset); err != nil {
			return Lost(fmt.Errorf("bad stream frame: %v", err))
		}
		if err := frame(&f); err != nil {
			return err
		}
	}
}

// Send hands c to the worker's stream unless ctx ended first.
func Send(ctx context.Context, ch chan<- engine.Chunk, c engine.Chunk) bool {
	select {
	case ch <- c:
		return true
	case <-ctx.Done():
		return false
	}
}

// StreamEnded reports whether a stream ReadFrames read ended with a finish
// reason; otherwise it sends the failure (none when the reader was
// stopped: no one is listening).
func StreamEnded(ctx context.Context, ch chan<- engine.Chunk, err error, fin kv.FinishReason) bool {
	switch {
	case errors.Is(err, ErrStopped):
		return false
	case err == nil && fin == kv.FinishNone:
		err = Lost(errors.New("stream ended without a finish reason"))
	}
	if err != nil {
		Send(ctx, ch, engine.Chunk{Err: err, Finish: kv.FinishError})
		return false
	}
	return true
}

// StreamOptions is OpenAI's stream_options, as vLLM and TensorRT-LLM take it.
type StreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// Usage is an OpenAI completion's usage object as vLLM and TensorRT-LLM
// answer it.
type Usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// Engine is the usage in the engine's terms.
func (u *Usage) Engine() *engine.Usage {
	out := &engine.Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens}
	if d := u.PromptTokensDetails; d != nil {
		out.CachedTokens = d.CachedTokens
	}
	return out
}

// ServedModel is one entry of an OpenAI-compatible server's /v1/models.
type ServedModel struct {
	ID          string `json:"id"`
	MaxModelLen int    `json:"max_model_len"` // vLLM's; 0 where the server does not say
}

// PickModel reads the server's /v1/models and returns the entry named
// want, or with want "" the first; kind names the engine in errors
// ("vllm").
func PickModel(ctx context.Context, c *http.Client, base, want, kind string) (ServedModel, error) {
	var list struct {
		Data []ServedModel `json:"data"`
	}
	if err := GetJSON(ctx, c, base+"/v1/models", &list); err != nil {
		return ServedModel{}, fmt.Errorf("%s engine models: %w", kind, err)
	}
	if len(list.Data) == 0 {
		return ServedModel{}, fmt.Errorf("%s engine %s serves no model", kind, base)
	}
	var names []string
	for _, m := range list.Data {
		if want == "" || m.ID == want {
			return m, nil
		}
		names = append(names, m.ID)
	}
	return ServedModel{}, fmt.Errorf("%s engine %s does not serve model %q (it serves %q)", kind, base, want, names)
}

// DropIntList returns data with the member "key":[…] of a flat list of
// integers made "key":null, or data itself when it has none. encoding/json
// validates a whole message before decoding it and then skips an unknown
// member byte by byte: for a 64k-token prompt's ids, which vLLM sends back
// in its first frame (prompt_token_ids, with return_token_ids), that is
// two passes of a JSON scanner over ~400 KB; this is one byte search.
// Inside a JSON string the quotes around key would be escaped, so a match
// is always a member name.
func DropIntList(data []byte, key string) []byte {
	name := `"` + key + `"`
	i := bytes.Index(data, []byte(name))
	if i < 0 {
		return data
	}
	j := i + len(name)
	for j < len(data) && isJSONSpace(data[j]) {
		j++
	}
	if j >= len(data) || data[j] != ':' {
		return data
	}
	j++
	for j < len(data) && isJSONSpace(data[j]) {
		j++
	}
	if j >= len(data) || data[j] != '[' {
		return data
	}
	start := j
	end := bytes.IndexByte(data[start:], ']')
	if end < 0 {
		return data
	}
	end += start + 1
	for _, c := range data[start+1 : end-1] {
		if (c < '0' || c > '9') && c != ',' && c != '-' && !isJSONSpace(c) {
			return data // not a flat integer list: the decoder judges it
		}
	}
	out := make([]byte, 0, len(data)-(end-start)+4)
	out = append(out, data[:start]...)
	out = append(out, "null"...)
	return append(out, data[end:]...)
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
