package frontend

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvmesh/kvmesh/internal/stages"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/tokenizer"
)

// usage is what a finished generation reports.
type usage struct {
	PromptTokens     int
	CompletionTokens int
	CachedTokens     int
}

// genOutcome is how a generation ended.
type genOutcome struct {
	Finish kv.FinishReason
	Usage  usage
	// EOS is the end token that ended the generation, when one did (EndsEOS):
	// not a stop string, not a length limit.
	EOS     uint32
	EndsEOS bool
}

// generate runs one prompt to completion, calling emit with every piece of
// text as soon as it is final. It migrates the request to another worker
// when its worker dies, so emit sees one uninterrupted stream. A non-nil
// error before anything was emitted becomes the HTTP error; after that the
// caller reports it in-stream. hashes (nil: none) are the block hashes
// prompt's tokens carry to routing (every attempt's tokens start with
// prompt). flush (nil: none) is called whenever the
// worker has no further output ready, so a streaming caller may buffer
// emitted pieces until then: one write per burst, not per token, when the
// frontend falls behind.
func (s *Server) generate(ctx context.Context, m *Model, reqID string, prompt []uint32, hashes *kv.PromptHashes, p genParams, emit func(text string) error, flush func() error) (genOutcome, *apiError) {
	maxTokens, aerr := s.maxTokens(m, p)
	if aerr != nil {
		return genOutcome{}, aerr
	}
	if limit := s.maxContext(m); limit > 0 {
		if len(prompt) >= limit {
			return genOutcome{}, contextExceeded(p.promptParam, "This model's maximum context length is %d tokens. However, your %s resulted in %d tokens, which leaves no room for a completion. Please reduce the length of the %s.",
				limit, p.promptParam, len(prompt), p.promptParam)
		}
		if room := limit - len(prompt); maxTokens > room {
			if p.MaxTokens > 0 {
				return genOutcome{}, contextExceeded(p.maxTokensParam, "This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the %s, %d in the completion). Please reduce the length of the %s or completion.",
					limit, len(prompt)+p.MaxTokens, len(prompt), p.promptParam, p.MaxTokens, p.promptParam)
			}
			maxTokens = room
			if p.MinTokens > room {
				return genOutcome{}, contextExceeded("min_tokens", "This model's maximum context length is %d tokens. However, you requested at least %d tokens (%d in the %s, %d in the completion). Please reduce the length of the %s or 'min_tokens'.",
					limit, len(prompt)+p.MinTokens, len(prompt), p.promptParam, p.MinTokens, p.promptParam)
			}
		}
	}
	sp := trace.SpanFromContext(ctx) // the request's (tracing.go); a no-op when off
	if sp.IsRecording() {
		sp.SetAttributes(attribute.String("kvmesh.request_id", reqID))
	}
	seed := p.Seed
	if !p.HasSeed {
		seed = s.rng()
	}

	detok := m.NewDetokenizer()
	var stops *tokenizer.StopMatcher
	if len(p.Stop) > 0 {
		stops = tokenizer.NewStopMatcher(p.Stop)
	}
	// Resolved once: a label lookup per token costs more than the observation.
	obs := latencyObs{ttft: s.metrics.ttft.WithLabelValues(m.Name), itl: s.metrics.itl.WithLabelValues(m.Name), clk: stages.From(ctx)}
	out := genOutcome{Usage: usage{PromptTokens: len(prompt)}}
	var generated []uint32
	started := time.Now()
	var lastToken time.Time
	stopHit := false
	firstWritten := false
	if flush != nil && obs.clk != nil {
		// The first flush after the first token put it on the wire.
		inner := flush
		flush = func() error {
			err := inner()
			if !lastToken.IsZero() && !firstWritten {
				firstWritten = true
				obs.clk.Mark(stages.FirstWrite)
			}
			return err
		}
	}

	emitText := func(t string) error {
		if t == "" {
			return nil
		}
		return emit(t)
	}

	for attempt := 0; ; attempt++ {
		// The prompt as it is (nothing writes to it; the cap makes an append
		// copy); a migrated attempt resends it with what was generated.
		tokens := prompt[:len(prompt):len(prompt)]
		if len(generated) > 0 {
			tokens = append(append(make([]uint32, 0, len(prompt)+len(generated)), prompt...), generated...)
		}
		smp := p.Sampling
		smp.MaxTokens, smp.StopTokens, smp.Seed = maxTokens-len(generated), m.EOS, seed
		smp.MinTokens = max(p.MinTokens-len(generated), 0)
		req := &kv.GenerateRequest{RequestID: reqID, Model: m.base(), LoRA: m.LoRA, CacheSalt: p.CacheSalt, Tokens: tokens, Sampling: smp, Attempt: attempt,
			Hashes: hashes}
		// Each attempt has its own context: cancelling it ends a pump's
		// pending Recv before the stream is closed.
		actx, acancel := context.WithCancel(ctx)
		stream, err := s.backend.Generate(actx, req)
		if err != nil {
			acancel()
			if errors.Is(err, kv.ErrWorkerLost) && attempt < s.cfg.MigrationLimit && ctx.Err() == nil {
				s.metrics.migrations.Inc()
				sp.AddEvent("migrate", trace.WithAttributes(attribute.Int("kvmesh.attempt", attempt+1), attribute.String("error", err.Error())))
				continue
			}
			return out, s.backendError(ctx, err)
		}
		rd := &chunkReader{ctx: ctx, stream: stream, flush: flush}
		rd.polled, _ = stream.(polledStream)
		finished, lost, aerr := s.drain(ctx, rd, m, obs, &out, &generated, detok, stops, emitText, started, &lastToken, &stopHit)
		acancel()
		rd.stop() // a pump's Recv and Close must not run at once
		stream.Close()
		if aerr != nil {
			return out, aerr
		}
		if finished {
			break
		}
		if lost != nil {
			if ctx.Err() != nil {
				return out, cancelled(ctx)
			}
			if attempt < s.cfg.MigrationLimit && ctx.Err() == nil && len(generated) < maxTokens {
				s.log.Warn("migrating request after worker loss", "request", reqID, "generated", len(generated), "attempt", attempt+1, "err", lost)
				s.metrics.migrations.Inc()
				sp.AddEvent("migrate", trace.WithAttributes(attribute.Int("kvmesh.attempt", attempt+1), attribute.Int("kvmesh.generated_tokens", len(generated)), attribute.String("error", lost.Error())))
				continue
			}
			if len(generated) >= maxTokens {
				out.Finish = kv.FinishLength
				break
			}
			return out, unavailable(1, "the worker failed mid-generation and the migration limit (%d) is spent: %v", s.cfg.MigrationLimit, lost)
		}
	}
	if !stopHit {
		tail := detok.Flush()
		hit := false
		if stops != nil {
			tail, hit = stops.Feed(tail)
			if !hit {
				tail += stops.Flush()
			}
		}
		if err := emitText(tail); err != nil {
			return out, clientGone(err)
		}
		if hit {
			out.Finish = kv.FinishStop
		}
	}
	out.Usage.CompletionTokens = len(generated)
	if n := len(generated); n > 0 && !stopHit && isEOS(m, generated[n-1]) {
		out.EOS, out.EndsEOS = generated[n-1], true
	}
	if flush != nil && !lastToken.IsZero() && !firstWritten && obs.clk != nil {
		// The whole answer came at once, read without a flush between its
		// chunks: its first token goes on the wire now.
		if err := flush(); err != nil {
			return out, clientGone(err)
		}
	}
	return out, nil
}

// drain reads one stream. It returns finished when the generation ended
// (finish reason set), lost when the worker failed and migration may help.
func (s *Server) drain(ctx context.Context, rd *chunkReader, m *Model, obs latencyObs, out *genOutcome, generated *[]uint32,
	detok Detokenizer, stops *tokenizer.StopMatcher, emit func(string) error, started time.Time, lastToken *time.Time, stopHit *bool) (finished bool, lost error, aerr *apiError) {
	for {
		ch, err := rd.next()
		var ee *emitError
		if errors.As(err, &ee) {
			return false, nil, clientGone(ee.err)
		}
		if err == io.EOF {
			// A stream that ends without a finish reason lost its worker.
			return false, kv.ErrWorkerLost, nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return false, nil, cancelled(ctx)
			}
			if errors.Is(err, kv.ErrWorkerLost) {
				return false, err, nil
			}
			return false, nil, s.backendError(ctx, err)
		}
		// One clock read per chunk: its tokens arrived together.
		now := time.Now()
		for _, id := range ch.Tokens {
			if lastToken.IsZero() {
				obs.ttft.Observe(now.Sub(started).Seconds())
				obs.clk.Mark(stages.FirstToken)
			} else {
				obs.itl.Observe(now.Sub(*lastToken).Seconds())
			}
			*lastToken = now
			*generated = append(*generated, id)
			if isEOS(m, id) {
				continue // counted, never shown (like skip_special_tokens)
			}
			text := detok.Add(id)
			if stops != nil {
				var hit bool
				text, hit = stops.Feed(text)
				if err := emit(text); err != nil {
					return false, nil, clientGone(err)
				}
				if hit {
					out.Finish, *stopHit = kv.FinishStop, true
					return true, nil, nil
				}
				continue
			}
			if err := emit(text); err != nil {
				return false, nil, clientGone(err)
			}
		}
		if ch.Finish != "" {
			// The finishing worker's cache hits; after a migration its prompt
			// includes generated tokens, so cap at the client's prompt.
			out.Usage.CachedTokens = min(ch.CachedTokens, out.Usage.PromptTokens)
			out.Finish = ch.Finish
			return true, nil, nil
		}
	}
}

// emitError is a failed write to the client.
type emitError struct{ err error }

func (e *emitError) Error() string { return e.err.Error() }

// chunkReader reads one worker stream for generate. Without a flush (a
// non-streaming client) it is a plain Recv. For a streaming client it
// flushes what was written before it waits for the next chunk, and it
// reads in the caller's goroutine while the client keeps up: no extra
// goroutine per request and no hand-off per token. Every chunk already
// waiting is written before one flush, so a stream that falls behind costs
// one write per burst, not per token; a chunk that arrives alone is
// flushed at once. A stream that can say without blocking whether a chunk
// is waiting (polled: serve's workers in process) is asked; any other,
// once a chunk is found already waiting (the frontend is behind), is read
// by a pump goroutine that queues chunks.
type chunkReader struct {
	ctx    context.Context
	stream kv.TokenStream
	flush  func() error
	pump   *pump
	polled polledStream // stream, when it is one
}

// polledStream is a stream whose TryRecv is Recv when a chunk is already
// waiting (ok), and otherwise returns at once with ok false (the end or a
// failure is then Recv's to report).
type polledStream interface {
	TryRecv() (ch kv.TokenChunk, ok bool, err error)
}

// behindAfter: a Recv that returns sooner than this found its chunk
// waiting. Waiting for a chunk that is not there yet takes at least a
// scheduler wake-up (tens of µs); a queued one returns in about 1 µs.
const behindAfter = 10 * time.Microsecond

func (r *chunkReader) next() (kv.TokenChunk, error) {
	if r.flush == nil {
		return r.stream.Recv()
	}
	if r.polled != nil {
		if ch, ok, err := r.polled.TryRecv(); ok {
			return ch, err
		}
		if err := r.flush(); err != nil {
			return kv.TokenChunk{}, &emitError{err}
		}
		return r.stream.Recv()
	}
	if r.pump != nil {
		if x, ok := r.pump.ready(); ok {
			return x.ch, x.err
		}
	}
	if err := r.flush(); err != nil {
		return kv.TokenChunk{}, &emitError{err}
	}
	if r.pump != nil {
		return r.pump.wait(r.ctx)
	}
	t0 := time.Now()
	ch, err := r.stream.Recv()
	if err == nil && ch.Finish == "" && time.Since(t0) < behindAfter {
		r.pump = startPump(r.stream)
	}
	return ch, err
}

// stop ends the pump, if one runs; the stream's context is cancelled, so
// its pending Recv returns.
func (r *chunkReader) stop() {
	if r.pump != nil {
		r.pump.stop()
	}
}

// pump reads a stream in its own goroutine so the reader can tell whether
// the next chunk is already there (keep writing) or not (flush first).
type pump struct {
	out    chan pumped
	quit   chan struct{}
	exited chan struct{}
}

type pumped struct {
	ch  kv.TokenChunk
	err error
}

func startPump(stream kv.TokenStream) *pump {
	p := &pump{out: make(chan pumped, 16), quit: make(chan struct{}), exited: make(chan struct{})}
	go func() {
		defer close(p.exited)
		for {
			ch, err := stream.Recv()
			select {
			case p.out <- pumped{ch, err}:
			case <-p.quit:
				return
			}
			if err != nil || ch.Finish != "" {
				return
			}
		}
	}()
	return p
}

func (p *pump) ready() (pumped, bool) {
	select {
	case r := <-p.out:
		return r, true
	default:
		return pumped{}, false
	}
}

func (p *pump) wait(ctx context.Context) (kv.TokenChunk, error) {
	select {
	case r := <-p.out:
		return r.ch, r.err
	case <-ctx.Done():
		return kv.TokenChunk{}, ctx.Err()
	}
}

// stop waits for the goroutine to end; the caller has cancelled the
// stream's context, so a pending Recv returns.
func (p *pump) stop() {
	close(p.quit)
	<-p.exited
}

// latencyObs are one request's token-latency histograms and its stage
// clock (nil: none).
type latencyObs struct {
	ttft, itl prometheus.Observer
	clk       *stages.Clock
}

// clientGone marks a failure to write to, or a cancellation by, the client;
// there is nobody left to answer.
func clientGone(err error) *apiError {
	return &apiError{Status: 499, Type: "client_closed_request", Message: "client went away: " + err.Error()}
}

// ErrShuttingDown is the cause with which a server cancels the requests
// still running when it shuts down (context.WithCancelCause on the
// requests' base context): they answer 503, not the 499 of a client that
// left.
var ErrShuttingDown = errors.New("server shutting down")

// cancelled is the answer to a request whose context ended: the server's
// shutdown, or the client leaving.
func cancelled(ctx context.Context) *apiError {
	if errors.Is(context.Cause(ctx), ErrShuttingDown) {
		return withCode(unavailable(1, "the server is shutting down; retry the request"), "server_shutting_down")
	}
	return clientGone(ctx.Err())
}

// contextExceeded is OpenAI's answer to a prompt plus completion that the
// model's context cannot hold.
func contextExceeded(param, format string, args ...any) *apiError {
	return withCode(invalid(param, format, args...), "context_length_exceeded")
}

func (s *Server) backendError(ctx context.Context, err error) *apiError {
	if ctx.Err() != nil {
		return cancelled(ctx)
	}
	var busy *kv.BusyError
	var full *kv.QueueFullError
	switch {
	case errors.As(err, &full):
		return queueFull(max(int(full.RetryAfter/time.Second), 1), "the router queue for this model is full; retry after %d s", max(int(full.RetryAfter/time.Second), 1))
	case errors.As(err, &busy):
		secs := int(busy.RetryAfter / time.Second)
		if secs < 1 {
			secs = 1
		}
		return unavailable(secs, "every worker is busy; retry after %d s", secs)
	case errors.Is(err, kv.ErrNoWorkers):
		if err != kv.ErrNoWorkers { // the backend said why (e.g. a missing decode pool)
			return unavailable(1, "no worker is available for this model right now: %v", err)
		}
		return unavailable(1, "no worker is available for this model right now")
	case errors.Is(err, kv.ErrCredentials):
		// The frontend's own configuration: retrying will not help.
		return unavailable(0, "%v", err)
	case errors.Is(err, kv.ErrWorkerLost):
		return unavailable(1, "the worker failed and the request could not be migrated: %v", err)
	case errors.Is(err, kv.ErrRejected):
		// Another worker would reject it too: a 400, never migrated.
		return invalid("", "%v", err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return clientGone(err)
	}
	return internal("generation failed: %v", err)
}

func isEOS(m *Model, id uint32) bool {
	for _, e := range m.EOS {
		if e == id {
			return true
		}
	}
	return false
}
