// Package tracing owns kvmesh's OpenTelemetry set-up: it reads the standard
// OTEL_* environment variables, builds the SDK's tracer provider with an
// OTLP exporter, and hands the processes' rooms a trace.Tracer (nil when
// tracing is off, so the request path skips every span). W3C trace context
// crosses HTTP in frontend and gRPC in api (api/trace.go), not here.
//
// It may import the OpenTelemetry API, SDK and OTLP exporters; nothing of
// kvmesh. Only cmd/kvmesh and tests import it: the
// rooms take a trace.Tracer (the OTel API) in their configs.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Instrumentation scope of kvmesh's spans.
const Scope = "github.com/kvmesh/kvmesh"

// Env reads an environment variable (os.Getenv; tests pass a map).
type Env func(string) string

// Enabled says whether the environment asks for traces, following the
// OpenTelemetry SDK specification's variables: OTEL_SDK_DISABLED=true or
// OTEL_TRACES_EXPORTER=none turn them off; OTEL_TRACES_EXPORTER=otlp turns
// them on; unset, an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) turns them on. kvmesh stays off
// without one, rather than send to a collector on localhost that is not there.
func Enabled(env Env) (bool, error) {
	if strings.EqualFold(strings.TrimSpace(env("OTEL_SDK_DISABLED")), "true") {
		return false, nil
	}
	switch ex := strings.TrimSpace(env("OTEL_TRACES_EXPORTER")); ex {
	case "none":
		return false, nil
	case "otlp":
		return true, nil
	case "":
		return env("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "", nil
	default:
		return false, fmt.Errorf("OTEL_TRACES_EXPORTER: %q is not supported (otlp or none)", ex)
	}
}

// protocol is the OTLP transport asked for: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
// else OTEL_EXPORTER_OTLP_PROTOCOL, else the specification's default,
// http/protobuf.
func protocol(env Env) (string, error) {
	name, p := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", strings.TrimSpace(env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"))
	if p == "" {
		name, p = "OTEL_EXPORTER_OTLP_PROTOCOL", strings.TrimSpace(env("OTEL_EXPORTER_OTLP_PROTOCOL"))
	}
	switch p {
	case "", "http/protobuf":
		return "http/protobuf", nil
	case "grpc":
		return "grpc", nil
	}
	return "", fmt.Errorf("%s: %q is not supported (http/protobuf or grpc)", name, p)
}

// Setup builds the tracer provider the environment asks for. Off, it
// returns a nil Tracer and a no-op shutdown. On, spans go through a batch
// processor (OTEL_BSP_*) to an OTLP exporter, which reads the endpoint,
// headers, timeout, compression and TLS variables itself; the sampler
// follows OTEL_TRACES_SAMPLER (default: parent-based, always on), and the
// resource OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, with service as
// the default service name. shutdown flushes what is buffered.
//
// Only the two OTLP trace exporters are linked: the contrib "autoexport"
// package would choose exporters from the same variables but pulls in
// metric and log pipelines (and Prometheus) that kvmesh does not use.
func Setup(ctx context.Context, service string) (trace.Tracer, func(context.Context) error, error) {
	env := Env(os.Getenv) // the exporters read the same environment
	noop := func(context.Context) error { return nil }
	on, err := Enabled(env)
	if err != nil || !on {
		return nil, noop, err
	}
	proto, err := protocol(env)
	if err != nil {
		return nil, noop, err
	}
	var exp sdktrace.SpanExporter
	switch proto {
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, noop, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", service)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES: after, so they win
		resource.WithTelemetrySDK())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		_ = exp.Shutdown(ctx)
		return nil, noop, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return tp.Tracer(Scope), tp.Shutdown, nil
}

// ShutdownTimeout bounds the final flush when a process exits.
const ShutdownTimeout = 5 * time.Second
