package worker

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/kv"
)

// Tracing: with Config.Tracer set, each Generate call is a server span
// whose parent is the traceparent the fleet sent in the call's metadata
// (api.TraceContextFrom); the sim's peer side adds hint.fetch and
// handoff.pull spans under it (engine/sim/simpeer). Without a tracer nothing is
// started.

const tracerScope = "github.com/kvmesh/kvmesh"

// tracedStream is a Generate stream whose context carries the span.
type tracedStream struct {
	api.Worker_GenerateServer
	ctx context.Context
}

func (t tracedStream) Context() context.Context { return t.ctx }

// startSpan starts req's server span; end records how the call ended.
func (s *server) startSpan(req *api.GenerateRequest, stream api.Worker_GenerateServer) (api.Worker_GenerateServer, func(result string, err error)) {
	t := s.w.cfg.Tracer
	if t == nil {
		return stream, func(string, error) {}
	}
	leg := kv.LegWhole
	switch req.Leg {
	case api.Leg_LEG_PREFILL:
		leg = kv.LegPrefill
	case api.Leg_LEG_DECODE:
		leg = kv.LegDecode
	}
	ctx, sp := t.Start(api.TraceContextFrom(stream.Context()), "kvmesh.api.v1.Worker/Generate",
		trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
			attribute.String("rpc.system", "grpc"), attribute.String("rpc.service", "kvmesh.api.v1.Worker"), attribute.String("rpc.method", "Generate"),
			attribute.String("kvmesh.request_id", req.RequestId), attribute.String("gen_ai.request.model", s.w.cfg.Model),
			attribute.String("kvmesh.leg", leg.String()), attribute.Int("kvmesh.dp_rank", int(req.DpRank)),
			attribute.Int("gen_ai.usage.input_tokens", len(req.Tokens)), attribute.Bool("kvmesh.hint", req.KvFetch != nil || len(req.KvHint) > 0)))
	return tracedStream{stream, ctx}, func(result string, err error) {
		sp.SetAttributes(attribute.String("kvmesh.result", result))
		if err != nil {
			sp.RecordError(err)
			sp.SetStatus(codes.Error, err.Error())
		}
		sp.End()
	}
}
