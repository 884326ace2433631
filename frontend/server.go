// Package frontend is kvmesh's OpenAI-compatible HTTP API: it validates
// requests, renders chat templates, tokenizes, hands tokens to a Backend,
// detokenizes and streams the answer back, migrating a request to another
// worker when its worker dies (a kv.ErrWorkerLost from the backend). It owns
// HTTP only: parsing, templates, SSE, errors and its metrics.
//
// The Backend and ContextLimiter interfaces are its own, over the request
// vocabulary of package kv; cmd/kvmesh hands it the fleet. It must not
// import fleet, router, index, discovery, eventplane, api or NATS: it knows
// nothing of workers.
package frontend

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvmesh/kvmesh/internal/stages"
)

// Config tunes the frontend.
type Config struct {
	// MaxBodyBytes bounds a request body (413 above it).
	MaxBodyBytes int64
	// MigrationLimit is how many times a request may move to another worker
	// after its worker dies mid-stream.
	MigrationLimit int
	// Ready reports whether the frontend can serve (GET /health); nil: always.
	Ready func() error
	// Warnings, when set, are shown by a healthy /health: what is wrong
	// but does not stop serving (e.g. prefill workers without decode
	// workers, while aggregated ones serve the model).
	Warnings func() []string
	// MaxTokensLimit is the most tokens one request may ask to generate
	// (400 above it), so no request holds a worker for minutes; 0: the
	// context length is the only limit.
	MaxTokensLimit int
	// APIKeys, when set, are required as Authorization: Bearer on every
	// route but /health, /live and (with OpenMetrics) /metrics (auth.go).
	APIKeys     *APIKeys
	OpenMetrics bool
	// AdminKeys, when set, are the only credential /debug/* accepts (it
	// shows what the router caches, a function of every tenant's prompts);
	// nil: /debug/* is 404.
	AdminKeys *APIKeys
	// Tracer, when set, traces every API request (tracing.go); nil: off.
	Tracer trace.Tracer
	// Timeouts bound how long a client may hold a connection without
	// finishing its request (HTTPServer and ServeHTTP apply them).
	Timeouts Timeouts
	// ChatMemoBytes bounds the chat memo (chatmemo.go): recent chat
	// bodies' parsed and rendered starts, so a conversation's next turn
	// reads only its new messages (0: 32 MiB; negative: off).
	ChatMemoBytes int
	// Tokenizers bounds the prompts tokenized at once (0: one per CPU).
	Tokenizers int
	// Logger receives the frontend's logs; nil: slog.Default().
	Logger *slog.Logger
}

// Timeouts are the front door's limits on slow clients. None bounds a
// response: a stream may run as long as its generation does.
type Timeouts struct {
	// ReadHeader bounds the request line and headers.
	ReadHeader time.Duration
	// ReadBody bounds the body, from the end of the headers: a body
	// dribbled a byte at a time is cut with the connection.
	ReadBody time.Duration
	// Idle bounds a keep-alive connection waiting for its next request.
	Idle time.Duration
}

// DefaultTimeouts: 10 s for headers, 30 s for a body (16 MiB at ~0.5 MB/s),
// 90 s between requests on a keep-alive connection.
func DefaultTimeouts() Timeouts {
	return Timeouts{ReadHeader: 10 * time.Second, ReadBody: 30 * time.Second, Idle: 90 * time.Second}
}

// DefaultConfig returns the defaults: 16 MiB bodies, 3 migrations, the
// default timeouts.
func DefaultConfig() Config {
	return Config{MaxBodyBytes: 16 << 20, MigrationLimit: 3, Timeouts: DefaultTimeouts()}
}

// Server is the HTTP frontend.
type Server struct {
	cfg      Config
	backend  Backend
	models   ModelSource
	metrics  *metrics
	stages   *stages.Recorder // kvmesh_request_stage_seconds, shared with serve's workers
	gatherer prometheus.Gatherer
	mux      *http.ServeMux
	rng      func() uint64
	limiter  ContextLimiter // the backend's, if it knows its workers' context
	adapters AdapterLister  // the backend's, if its workers serve LoRA adapters
	log      *slog.Logger
	// tokenSlots holds a slot per prompt being tokenized (tokenize.go).
	tokenSlots chan struct{}
	memo       *chatMemo // nil: off

	unauthorized prometheus.Counter
}

// New builds a frontend. Its metrics go to reg (and GET /metrics serves
// gatherer); both may be one *prometheus.Registry.
func New(cfg Config, backend Backend, models ModelSource, reg prometheus.Registerer, gatherer prometheus.Gatherer) *Server {
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultConfig().MaxBodyBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Tokenizers <= 0 {
		cfg.Tokenizers = runtime.GOMAXPROCS(0)
	}
	s := &Server{cfg: cfg, backend: backend, models: models, metrics: newMetrics(reg), gatherer: gatherer, rng: randomU64,
		log: cfg.Logger, tokenSlots: make(chan struct{}, cfg.Tokenizers)}
	if cfg.ChatMemoBytes == 0 {
		cfg.ChatMemoBytes = chatMemoBytes
	}
	s.memo = newChatMemo(cfg.ChatMemoBytes)
	rec, err := stages.New(reg)
	if err != nil {
		panic(err) // as MustRegister: a registry holding another kind of collector under the name
	}
	s.stages = rec
	if reg != nil {
		reg.MustRegister(newPrefixCollector(models))
	}
	s.limiter, _ = backend.(ContextLimiter)
	s.adapters, _ = backend.(AdapterLister)
	s.unauthorized = newUnauthorized(reg)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.instrument("chat", s.handleChat))
	mux.HandleFunc("POST /v1/completions", s.instrument("completions", s.handleCompletions))
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("GET /v1/models/{id...}", s.handleModel) // ids may hold slashes (org/name)
	mux.HandleFunc("GET /health", s.handleHealth)
	mux.HandleFunc("GET /live", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"status":"live"}`)
	})
	if gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	}
	s.routeDashboard(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error",
			Message: "unknown route " + r.Method + " " + r.URL.Path})
	})
	s.mux = mux
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if d := s.cfg.Timeouts.ReadBody; d > 0 && r.Body != nil && r.Body != http.NoBody {
		// Per request rather than http.Server.ReadTimeout: that deadline
		// would stay on the connection and end a long stream's context.
		// readBody lifts it once the body is in.
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(d))
	}
	if s.authorize(w, r) {
		s.mux.ServeHTTP(w, r)
	}
}

// HTTPServer is an http.Server for s with its header and idle timeouts (the
// body's is s's own). It sets no WriteTimeout: that would cut long streams.
func (s *Server) HTTPServer() *http.Server {
	t := s.cfg.Timeouts
	return &http.Server{Handler: s, ReadHeaderTimeout: t.ReadHeader, IdleTimeout: t.Idle,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
}

func randomU64() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

func newID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// statusWriter remembers the status for the requests_total metric.
type statusWriter struct {
	http.ResponseWriter
	status int
	// abandoned: the client left mid-stream, after a 200 went out; counted
	// as 499 like a client that left before any answer.
	abandoned bool
}

func (w *statusWriter) abandon() { w.abandoned = true }

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach net/http's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// FlushError is Flush that reports a failed write (a client gone).
func (w *statusWriter) FlushError() error {
	// net/http's writer has FlushError: asserting it directly spares a
	// ResponseController and its unwrapping on every flush (one per burst).
	if f, ok := w.ResponseWriter.(interface{ FlushError() error }); ok {
		return f.FlushError()
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

func (s *Server) instrument(endpoint string, h func(http.ResponseWriter, *http.Request) string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.metrics.inflight.Inc()
		defer s.metrics.inflight.Dec()
		sw := &statusWriter{ResponseWriter: w}
		start := time.Now()
		r, endSpan := s.startRequestSpan(r, endpoint)
		r = r.WithContext(stages.With(r.Context(), s.stages.StartAt(start)))
		model := h(sw, r)
		if model == "" {
			model = "unknown" // bounded label: never the client's unvalidated string
		}
		status := sw.status
		if sw.abandoned {
			status = 499
		}
		endSpan(model, status)
		s.metrics.requests.WithLabelValues(model, endpoint, statusLabel(status)).Inc()
		s.metrics.duration.WithLabelValues(model, endpoint).Observe(time.Since(start).Seconds())
	}
}

func statusLabel(code int) string {
	if code == 0 {
		code = 499 // the client left before any answer
	}
	return strconv.Itoa(code)
}

// readBody reads a bounded body: 413 above the limit. A declared length
// over the limit is answered by tooLarge before anything is read; a chunked
// body is cut where it passes the limit.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	if r.ContentLength > s.cfg.MaxBodyBytes {
		s.tooLarge(w, r)
		return nil, errAnswered
	}
	// Sized from Content-Length when there is one: io.ReadAll starts at 512
	// bytes and copies the body at every doubling. Capped, so a declared
	// length the client does not send cannot reserve the whole limit.
	buf := getBody(int(min(max(r.ContentLength, 0), maxPrealloc)) + 1) // +1: EOF is read without growing
	body, err := readBodyInto(buf, http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err == nil && s.cfg.Timeouts.ReadBody > 0 {
		_ = http.NewResponseController(w).SetReadDeadline(time.Time{}) // the body is in: the stream may run on
	}
	if err != nil {
		releaseBody(body)
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
				Message: "request body exceeds the limit of " + strconv.FormatInt(s.cfg.MaxBodyBytes, 10) + " bytes"}
		}
		return nil, invalid("", "could not read the request body: %v", err)
	}
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(strings.ToLower(ct), "application/json") {
		releaseBody(body)
		return nil, invalid("", "Content-Type must be application/json, got %q", ct)
	}
	return body, nil
}

// maxPrealloc bounds the body buffer reserved before the body arrives.
const maxPrealloc = 1 << 20

// bodies recycles request body buffers (*[]byte). A chat turn's body is
// its whole history, tens of KB by a conversation's later turns: a fresh
// buffer each request is memory zeroed (and faulted in) on the path and
// garbage after it. A body is released when its handler returns: nothing
// keeps it (parsed values are copies; the chat memo copies what it keeps).
var bodies sync.Pool

// getBody is an empty buffer of at least n bytes' capacity: a recycled
// one when it is large enough (a conversation's next turn is a little
// longer than the one before: the buffer is sized to the request, not
// to the pool's largest).
func getBody(n int) []byte {
	if p, ok := bodies.Get().(*[]byte); ok && cap(*p) >= n {
		return (*p)[:0]
	}
	return make([]byte, 0, n)
}

// releaseBody gives a body's buffer back for another request; b must not
// be used after. Buffers past maxPrealloc are left to the collector.
func releaseBody(b []byte) {
	if cap(b) == 0 || cap(b) > maxPrealloc+1 {
		return
	}
	if poisonReleasedBodies {
		clear(b[:cap(b)])
		return
	}
	b = b[:0]
	bodies.Put(&b)
}

// poisonReleasedBodies (tests) zeroes a released buffer and drops it, so
// a body kept past its handler reads as zeros, whatever is read next.
var poisonReleasedBodies bool

// readBodyInto is io.ReadAll appending to b.
func readBodyInto(b []byte, r io.Reader) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			return b, err
		}
	}
}

// errAnswered: the response was already written.
var errAnswered = &apiError{Status: -1, Message: "answered"}

// drainFor bounds the time spent dropping a refused body.
const drainFor = 10 * time.Second

// tooLarge answers 413 to a body whose Content-Length is over the limit
// before reading it, then reads and drops it (for at most drainFor): a
// client that writes its whole body before it reads the answer would
// otherwise meet a closed connection — a broken pipe, not the 413.
func (s *Server) tooLarge(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	drain := !strings.EqualFold(r.Header.Get("Expect"), "100-continue") && // such a client sends nothing after a 413
		rc.EnableFullDuplex() == nil // HTTP/1: read the body after the answer went out
	w.Header().Set("Connection", "close")
	writeError(w, &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
		Message: "request body of " + strconv.FormatInt(r.ContentLength, 10) + " bytes exceeds the limit of " + strconv.FormatInt(s.cfg.MaxBodyBytes, 10) + " bytes"})
	if !drain || rc.Flush() != nil {
		return
	}
	_ = rc.SetReadDeadline(time.Now().Add(drainFor))
	_, _ = io.CopyN(io.Discard, r.Body, r.ContentLength)
}

func (s *Server) lookupModel(name string) (*Model, *apiError) {
	m, ok := s.model(name)
	if !ok {
		return nil, notFound("model", "the model '%s' does not exist or is not served here", name)
	}
	return m, nil
}

// model resolves a request's model field: a served model, or a LoRA
// adapter some worker of a served model registered (vLLM serves an adapter
// under its own name).
func (s *Server) model(name string) (*Model, bool) {
	if m, ok := s.models.Model(name); ok || s.adapters == nil {
		return m, ok
	}
	for _, b := range s.models.Models() {
		if slices.Contains(s.adapters.Adapters(b.Name), name) {
			a := *b
			a.Name, a.LoRA, a.Base = name, name, b.Name
			return &a, true
		}
	}
	return nil, false
}

// maxContext is the context length a request to m must fit: the model's
// own bound and the backend's workers', whichever is smaller (0: none).
func (s *Server) maxContext(m *Model) int {
	n := m.MaxContext
	if s.limiter != nil {
		if c := s.limiter.MaxContext(m.base()); c > 0 && (n == 0 || c < n) {
			n = c
		}
	}
	return n
}

// modelCard is OpenAI's Model object; max_model_len (vLLM's field) is the
// context length when it is known.
type modelCard struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Created     int64  `json:"created"`
	OwnedBy     string `json:"owned_by"`
	MaxModelLen int    `json:"max_model_len,omitempty"`
	// Parent is the base model of a LoRA adapter (vLLM's field).
	Parent string `json:"parent,omitempty"`
}

func (s *Server) card(m *Model) modelCard {
	return modelCard{ID: m.Name, Object: "model", Created: m.Created, OwnedBy: "kvmesh", MaxModelLen: s.maxContext(m), Parent: m.Base}
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	ms := s.models.Models()
	sort.Slice(ms, func(i, j int) bool { return ms[i].Name < ms[j].Name })
	out := struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}{Object: "list", Data: []modelCard{}}
	for _, m := range ms {
		out.Data = append(out.Data, s.card(m))
		if s.adapters != nil {
			for _, name := range s.adapters.Adapters(m.Name) {
				a := *m
				a.Name, a.LoRA, a.Base = name, name, m.Name
				out.Data = append(out.Data, s.card(&a))
			}
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// handleModel is GET /v1/models/{id}: one Model object, or OpenAI's 404.
func (s *Server) handleModel(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	m, ok := s.model(id)
	if !ok {
		writeError(w, notFound("model", "The model '%s' does not exist or is not served here", id))
		return
	}
	writeJSON(w, http.StatusOK, s.card(m))
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	if s.cfg.Ready != nil {
		if err := s.cfg.Ready(); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unhealthy", "reason": err.Error()})
			return
		}
	}
	if s.cfg.Warnings != nil {
		if ws := s.cfg.Warnings(); len(ws) > 0 {
			writeJSON(w, http.StatusOK, map[string]any{"status": "healthy", "warnings": ws})
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "healthy"})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v) // a client gone: nothing to tell it
}
