package frontend

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// APIKeys are the bearer keys a frontend accepts. Only their SHA-256 sums
// are kept, and a presented key is compared against every one in constant
// time, so neither the comparison nor an early exit tells a client how much
// of a key it guessed right.
type APIKeys struct{ sums [][sha256.Size]byte }

// ParseAPIKeys reads keys one per line (also comma-separated, as
// KVMESH_API_KEYS holds them); blank lines and lines starting with # are
// skipped, surrounding spaces trimmed. A key may not contain spaces.
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
// says so. A refusal is OpenAI's 401.
func (s *Server) authorize(w http.ResponseWriter, r *http.Request) bool {
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
	auth := r.Header.Get("Authorization")
	key, bearer := strings.CutPrefix(auth, "Bearer ")
	if !bearer {
		if k, ok := strings.CutPrefix(auth, "bearer "); ok { // the scheme is case-insensitive
			key, bearer = k, true
		}
	}
	key = strings.TrimSpace(key)
	var e *apiError
	switch {
	case auth == "" || !bearer || key == "":
		e = &apiError{Status: http.StatusUnauthorized, Type: "invalid_request_error",
			Message: "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."}
	case !keys.valid(key):
		e = withCode(&apiError{Status: http.StatusUnauthorized, Type: "invalid_request_error",
			Message: "Incorrect API key provided."}, "invalid_api_key")
	default:
		return true
	}
	s.unauthorized.Inc()
	w.Header().Set("WWW-Authenticate", `Bearer realm="kvmesh"`)
	writeError(w, e)
	return false
}

func newUnauthorized(reg prometheus.Registerer) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "kvmesh_frontend_unauthorized_total",
		Help: "Requests refused with 401: no or a wrong API key."})
	if reg != nil {
		reg.MustRegister(c)
	}
	return c
}
