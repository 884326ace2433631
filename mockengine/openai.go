package mockengine

import (
	"encoding/json"
	"net/http"
)

// APIError is an error a handler answers with: vLLM's shape,
// {"error":{"message","type","param","code"}} where code is the HTTP
// status and type its Python exception-style name.
type APIError struct {
	Status  int
	Message string
	Param   string
}

func (e *APIError) Error() string { return e.Message }

// errorType is vLLM's type name for a status.
func errorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "BadRequestError"
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusUnprocessableEntity:
		return "UnprocessableEntityError"
	case http.StatusNotImplemented:
		return "NotImplementedError"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailableError"
	}
	return "InternalServerError"
}

func badRequest(msg, param string) *APIError {
	return &APIError{Status: http.StatusBadRequest, Message: msg, Param: param}
}

type errorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

type errorBody struct {
	Error errorInfo `json:"error"`
}

func errorJSON(e *APIError) []byte {
	info := errorInfo{Message: e.Message, Type: errorType(e.Status), Code: e.Status}
	if e.Param != "" {
		info.Param = &e.Param
	}
	b, _ := json.Marshal(errorBody{Error: info})
	return b
}

// WriteError answers with e in vLLM's error shape.
func WriteError(w http.ResponseWriter, e *APIError) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	_, _ = w.Write(errorJSON(e))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		WriteError(w, &APIError{Status: http.StatusInternalServerError, Message: err.Error()})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// respHead opens every response and stream chunk, vLLM's and
// TensorRT-LLM's alike, in this order.
type respHead struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
}

// choiceEnd closes a choice: how it finished (logprobs, which the
// stand-ins refuse, are null).
type choiceEnd struct {
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
	StopReason   any     `json:"stop_reason"`
}

func ended(finish *string, stopReason any) choiceEnd {
	return choiceEnd{FinishReason: finish, StopReason: stopReason}
}

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type usageInfo struct {
	PromptTokens        int            `json:"prompt_tokens"`
	TotalTokens         int            `json:"total_tokens"`
	CompletionTokens    int            `json:"completion_tokens"`
	PromptTokensDetails *promptDetails `json:"prompt_tokens_details"`
}

// sse writes a server-sent-event stream as vLLM does: "data: {json}\n\n"
// per chunk, "data: [DONE]\n\n" at the end, flushed per event.
type sse struct {
	w       http.ResponseWriter
	f       http.Flusher
	started bool
	err     error
}

func newSSE(w http.ResponseWriter) *sse {
	f, _ := w.(http.Flusher)
	return &sse{w: w, f: f}
}

func (s *sse) start() {
	if s.started {
		return
	}
	s.started = true
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	s.w.WriteHeader(http.StatusOK)
}

func (s *sse) raw(data []byte) {
	if s.err != nil {
		return
	}
	s.start()
	buf := make([]byte, 0, len(data)+8)
	buf = append(buf, "data: "...)
	buf = append(buf, data...)
	buf = append(buf, '\n', '\n')
	if _, s.err = s.w.Write(buf); s.err == nil && s.f != nil {
		s.f.Flush()
	}
}

func (s *sse) event(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		s.err = err
		return
	}
	s.raw(b)
}

func (s *sse) done() { s.raw([]byte("[DONE]")) }
