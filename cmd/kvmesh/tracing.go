package main

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/trace"

	"github.com/kvmesh/kvmesh/internal/tracing"
)

// setupTracing turns OpenTelemetry traces on when the standard OTEL_*
// variables ask for them (internal/tracing); a bad value is an error that
// names its variable. The returned stop flushes buffered spans.
func setupTracing(ctx context.Context, service string, log *slog.Logger) (trace.Tracer, func(), error) {
	t, shutdown, err := tracing.Setup(ctx, service)
	if err != nil {
		return nil, func() {}, err
	}
	if t == nil {
		return nil, func() {}, nil
	}
	log.Info("OpenTelemetry traces on", "service", service)
	return t, func() {
		sctx, cancel := context.WithTimeout(context.Background(), tracing.ShutdownTimeout)
		defer cancel()
		if err := shutdown(sctx); err != nil {
			log.Warn("flushing traces", "err", err)
		}
	}, nil
}
