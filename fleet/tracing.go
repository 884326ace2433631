package fleet

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/router"
)

// Tracing: under a request's recording span (the frontend's), each attempt
// adds a route span per routing decision, a client span per worker stream
// (open to finish; its context travels to the worker as traceparent, see
// api.WithTraceContext) and, for disaggregated serving, a handoff span from
// the prefill leg's answer to the decode leg's first token. Without a
// recording parent nothing is started.

const tracerScope = "github.com/kvmesh/kvmesh"

// childSpan starts a span under ctx's when that one records; otherwise it
// returns ctx and its non-recording span (End does nothing). Callers set
// attributes only on a recording span: building them allocates.
func childSpan(ctx context.Context, name string, kind trace.SpanKind) (context.Context, trace.Span) {
	return childSpanAt(ctx, name, kind, time.Time{})
}

// childSpanAt is childSpan started at t (zero: now).
func childSpanAt(ctx context.Context, name string, kind trace.SpanKind, t time.Time) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, parent
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(kind)}
	if !t.IsZero() {
		opts = append(opts, trace.WithTimestamp(t))
	}
	return parent.TracerProvider().Tracer(tracerScope).Start(ctx, name, opts...)
}

// routeSpan starts the span of one routing decision.
func routeSpan(ctx context.Context, req *kv.GenerateRequest, leg kv.Leg, path router.DisaggPath) (context.Context, trace.Span) {
	ctx, sp := childSpan(ctx, "route", trace.SpanKindInternal)
	if sp.IsRecording() {
		sp.SetAttributes(attribute.String("gen_ai.request.model", req.Model),
			attribute.String("kvmesh.leg", leg.String()), attribute.String("kvmesh.path", string(path)),
			attribute.Int("kvmesh.attempt", req.Attempt), attribute.Int("gen_ai.usage.input_tokens", len(req.Tokens)))
	}
	return ctx, sp
}

// workerSpan starts the client span of one worker stream.
func workerSpan(ctx context.Context, d *router.Decision, greq *api.GenerateRequest) (context.Context, trace.Span) {
	ctx, sp := childSpan(ctx, "worker.generate", trace.SpanKindClient)
	if sp.IsRecording() {
		sp.SetAttributes(workerAttrs(d.Worker)...)
		sp.SetAttributes(attribute.String("kvmesh.leg", legName(greq.Leg)), attribute.Bool("kvmesh.hint", greq.KvFetch != nil))
	}
	return ctx, sp
}

// endRoute records what the router decided (or why it could not).
func endRoute(sp trace.Span, d *router.Decision, err error) {
	if !sp.IsRecording() {
		return
	}
	if err != nil {
		sp.RecordError(err)
		sp.SetStatus(codes.Error, err.Error())
	} else {
		sp.SetAttributes(workerAttrs(d.Worker)...)
		sp.SetAttributes(attribute.Int("kvmesh.cached_tokens", d.CachedTokens), attribute.Int("kvmesh.prefill_tokens", d.PrefillTokens),
			attribute.Bool("kvmesh.hint", d.Hint != nil))
		if d.Hint != nil {
			sp.SetAttributes(attribute.String("kvmesh.hint.source", natsbus.InstanceToken(d.Hint.Source.Instance)), attribute.Int("kvmesh.hint.blocks", len(d.Hint.Hashes)))
		}
	}
	sp.End()
}

func workerAttrs(k kv.WorkerKey) []attribute.KeyValue {
	return []attribute.KeyValue{attribute.String("kvmesh.worker", natsbus.InstanceToken(k.Instance)), attribute.Int("kvmesh.dp_rank", int(k.DPRank))}
}

// endSpan ends sp (nil: none) with err's status, if any.
func endSpan(sp trace.Span, err error) {
	if sp == nil {
		return
	}
	if err != nil && sp.IsRecording() {
		sp.RecordError(err)
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}
