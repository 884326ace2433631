package frontend

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// APIKeys are the bearer keys a frontend accepts. Only their SHA-256 sums
// are kept, and a presented key is compared against every one in constant
// time, so neither the comparison nor an early exit tells a client how much
// of a key it guessed right.
type APIKeys struct{ sums [][sha256.Size]byte }

// MinAPIKeyLen is the shortest key ParseAPIKeys accepts, as for the fleet
// token: a short key is guessed by a client that can try many.
const MinAPIKeyLen = 16

// ParseAPIKeys reads keys one per line (also comma-separated, as
// KVMESH_API_KEYS holds them); blank lines and lines starting with # are
// skipped, surrounding spaces trimmed. A key may not contain spaces and has
// at least MinAPIKeyLen characters.
func ParseAPIKeys(texts ...string) (*APIKeys, error) {
	k := &APIKeys{}
	for _, text := range texts {
		for _, line := range strings.Split(text, "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			for _, key := range strings.Split(line, ",") {
				key = strings.TrimSpace(key)
				if key == "" {
					continue
				}
				if strings.ContainsAny(key, " \t") {
					return nil, errors.New("an API key contains whitespace")
				}
				if n := utf8.RuneCountInString(key); n < MinAPIKeyLen {
					return nil, fmt.Errorf("an API key has %d characters, want at least %d", n, MinAPIKeyLen)
				}
				k.sums = append(k.sums, sha256.Sum256([]byte(key)))
			}
		}
	}
	if len(k.sums) == 0 {
		return nil, errors.New("no API keys")
	}
	return k, nil
}

// Len is the number of keys.
func (k *APIKeys) Len() int { return len(k.sums) }

// valid reports whether key is one of k, looking at every key.
func (k *APIKeys) valid(key string) bool {
	sum := sha256.Sum256([]byte(key))
	ok := 0
	for i := range k.sums {
		ok |= subtle.ConstantTimeCompare(sum[:], k.sums[i][:])
	}
	return ok == 1
}

// authorize checks r's Authorization: Bearer key when keys are configured.
// /health and /live are always open (probes carry no keys); /metrics and
// the dashboard (a browser sends no key) are open when Config.OpenMetrics
// says so. /debug/* takes only an admin key (Config.AdminKeys) and is 404
// without any. A refusal is OpenAI's 401, sent before the body is read
// and closing the connection, so a stranger cannot hold it with a slow body.
func (s *Server) authorize(w http.ResponseWriter, r *http.Request) bool {
	if strings.HasPrefix(r.URL.Path, "/debug/") {
		return s.authorizeAdmin(w, r)
	}
	keys := s.cfg.APIKeys
	if keys == nil {
		return true
	}
	switch r.URL.Path {
	case "/health", "/live":
		return true
	case "/metrics":
		if s.cfg.OpenMetrics {
			return true
		}
	default:
		if s.cfg.OpenMetrics && strings.HasPrefix(r.URL.Path, "/dashboard") {
			return true
		}
	}
	key, given := bearerKey(r)
	switch {
	case !given:
		s.refuse(w, r, missingKey())
	case !keys.valid(key):
		s.refuse(w, r, wrongKey())
	default:
		return true
	}
	return false
}

// authorizeAdmin lets through a request that presents an admin key. An API
// key is not one: it gets 403.
func (s *Server) authorizeAdmin(w http.ResponseWriter, r *http.Request) bool {
	admin := s.cfg.AdminKeys
	if admin == nil {
		s.refuse(w, r, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error",
			Message: "unknown route " + r.Method + " " + r.URL.Path + " (the /debug routes need --admin-key-file)"})
		return false
	}
	key, given := bearerKey(r)
	switch {
	case !given:
		s.refuse(w, r, missingKey())
	case admin.valid(key):
		return true
	case s.cfg.APIKeys != nil && s.cfg.APIKeys.valid(key):
		s.refuse(w, r, &apiError{Status: http.StatusForbidden, Type: "invalid_request_error",
			Message: "the /debug routes need an admin key; an API key is not one"})
	default:
		s.refuse(w, r, wrongKey())
	}
	return false
}

// hasAPIKey reports whether r carries a valid API key, or none is needed.
func (s *Server) hasAPIKey(r *http.Request) bool {
	if s.cfg.APIKeys == nil {
		return true
	}
	key, given := bearerKey(r)
	return given && s.cfg.APIKeys.valid(key)
}

// bearerKey is the key of an Authorization: Bearer header (the scheme is
// case-insensitive); given is false when there is none.
func bearerKey(r *http.Request) (key string, given bool) {
	auth := r.Header.Get("Authorization")
	key, bearer := strings.CutPrefix(auth, "Bearer ")
	if !bearer {
		key, bearer = strings.CutPrefix(auth, "bearer ")
	}
	key = strings.TrimSpace(key)
	return key, bearer && key != ""
}

func missingKey() *apiError {
	return &apiError{Status: http.StatusUnauthorized, Type: "invalid_request_error",
		Message: "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."}
}

func wrongKey() *apiError {
	return withCode(&apiError{Status: http.StatusUnauthorized, Type: "invalid_request_error",
		Message: "Incorrect API key provided."}, "invalid_api_key")
}

// refuse answers e without reading r's body and closes the connection: no
// wait for a body declared but never sent (the read deadline is now).
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, e *apiError) {
	if e.Status == http.StatusUnauthorized {
		s.unauthorized.Inc()
		w.Header().Set("WWW-Authenticate", `Bearer realm="kvmesh"`)
	}
	if r.Body != nil && r.Body != http.NoBody {
		w.Header().Set("Connection", "close")
		_ = http.NewResponseController(w).SetReadDeadline(time.Now())
	}
	writeError(w, e)
}

func newUnauthorized(reg prometheus.Registerer) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "kvmesh_frontend_unauthorized_total",
		Help: "Requests refused with 401: no or a wrong API key."})
	if reg != nil {
		reg.MustRegister(c)
	}
	return c
}
