package api

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
)

// W3C trace context (traceparent, tracestate) travels from the fleet to a
// worker as gRPC metadata, so the worker's spans join the request's trace.

var traceContext = propagation.TraceContext{}

// mdCarrier adapts gRPC metadata to the propagator (keys are lower case in
// both).
type mdCarrier metadata.MD

func (c mdCarrier) Get(k string) string {
	if v := metadata.MD(c).Get(k); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c mdCarrier) Set(k, v string) { metadata.MD(c).Set(k, v) }

func (c mdCarrier) Keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	return out
}

// WithTraceContext adds ctx's span context to the outgoing metadata of the
// calls made with the returned context; ctx unchanged when no span records.
func WithTraceContext(ctx context.Context) context.Context {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	md := metadata.MD{}
	traceContext.Inject(ctx, mdCarrier(md))
	if len(md) == 0 {
		return ctx
	}
	kv := make([]string, 0, 2*len(md))
	for k, vs := range md {
		for _, v := range vs {
			kv = append(kv, k, v)
		}
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

// TraceContextFrom returns ctx carrying the remote span context that the
// incoming call's metadata names, if any: the parent of the worker's span.
func TraceContextFrom(ctx context.Context) context.Context {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok || len(md.Get("traceparent")) == 0 {
		return ctx
	}
	return traceContext.Extract(ctx, mdCarrier(md))
}
