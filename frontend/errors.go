package frontend

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
)

// apiError is an error in OpenAI's shape:
// {"error":{"message":…,"type":…,"param":…,"code":…}}.
type apiError struct {
	Status     int     `json:"-"`
	Message    string  `json:"message"`
	Type       string  `json:"type"`
	Param      *string `json:"param"`
	Code       *string `json:"code"`
	RetryAfter int     `json:"-"` // seconds; sets Retry-After when > 0
}

func (e *apiError) Error() string { return e.Message }

func invalid(param, format string, args ...any) *apiError {
	p := param
	var pp *string
	if p != "" {
		pp = &p
	}
	return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: pp, Message: fmt.Sprintf(format, args...)}
}

func withCode(e *apiError, code string) *apiError {
	e.Code = &code
	return e
}

// typeError is OpenAI's wording for a parameter of the wrong JSON type.
func typeError(param, want string, v []byte) *apiError {
	return withCode(invalid(param, "Invalid type for '%s': expected %s, but got %s instead.", param, want, jsonKind(v)), "invalid_type")
}

// unsupported names a parameter whose value asks for something kvmesh does
// not do: an answer that ignored it would be silently wrong.
func unsupported(param, format string, args ...any) *apiError {
	return withCode(invalid(param, format, args...), "unsupported_parameter")
}

func notFound(param, format string, args ...any) *apiError {
	e := invalid(param, format, args...)
	e.Status = http.StatusNotFound
	return withCode(e, "model_not_found")
}

func unavailable(retryAfter int, format string, args ...any) *apiError {
	return &apiError{Status: http.StatusServiceUnavailable, Type: "service_unavailable", RetryAfter: retryAfter, Message: fmt.Sprintf(format, args...)}
}

// queueFull is OpenAI's rate-limit answer (429, type "requests", code
// "rate_limit_exceeded"), sent when the router's queue is at its limit.
func queueFull(retryAfter int, format string, args ...any) *apiError {
	return withCode(&apiError{Status: http.StatusTooManyRequests, Type: "requests", RetryAfter: retryAfter, Message: fmt.Sprintf(format, args...)}, "rate_limit_exceeded")
}

func internal(format string, args ...any) *apiError {
	return &apiError{Status: http.StatusInternalServerError, Type: "internal_error", Message: fmt.Sprintf(format, args...)}
}

func writeError(w http.ResponseWriter, e *apiError) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	w.WriteHeader(e.Status)
	_ = json.NewEncoder(w).Encode(struct {
		Error *apiError `json:"error"`
	}{e})
}
