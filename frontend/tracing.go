package frontend

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Tracing: with Config.Tracer set, every API request is a server span,
// the child of the client's W3C traceparent when it sends one, with a
// tokenize span; the backend opens its spans (route, worker generate,
// handoff) under the same context. Without a tracer nothing is started.

// traceContext is W3C trace context: what clients and the workers speak.
var traceContext = propagation.TraceContext{}

// startRequestSpan starts r's server span; end records the status.
func (s *Server) startRequestSpan(r *http.Request, endpoint string) (*http.Request, func(model string, status int)) {
	t := s.cfg.Tracer
	if t == nil {
		return r, func(string, int) {}
	}
	ctx := traceContext.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, sp := t.Start(ctx, r.Method+" "+r.URL.Path, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path),
			attribute.String("kvmesh.endpoint", endpoint)))
	return r.WithContext(ctx), func(model string, status int) {
		sp.SetAttributes(attribute.String("gen_ai.request.model", model), attribute.Int("http.response.status_code", status))
		if status >= 500 {
			sp.SetStatus(codes.Error, http.StatusText(status))
		}
		sp.End()
	}
}

// childSpan starts a span under ctx's when that one records; otherwise it
// returns ctx and its non-recording span, whose End does nothing, at no cost.
func childSpan(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, parent
	}
	return parent.TracerProvider().Tracer(tracerScope).Start(ctx, name, trace.WithAttributes(attrs...))
}

// tracerScope names kvmesh's instrumentation scope (internal/tracing.Scope).
const tracerScope = "github.com/kvmesh/kvmesh"
