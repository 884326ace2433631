package tracing

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func envOf(m map[string]string) Env { return func(k string) string { return m[k] } }

func TestEnabled(t *testing.T) {
	for _, c := range []struct {
		env     map[string]string
		on      bool
		errWith string
	}{
		{env: nil},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, on: true},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, on: true},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, on: true},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}},
		{env: map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, errWith: "OTEL_TRACES_EXPORTER"},
	} {
		on, err := Enabled(envOf(c.env))
		if on != c.on || (err != nil) != (c.errWith != "") || (err != nil && !strings.Contains(err.Error(), c.errWith)) {
			t.Errorf("%v: on %v err %v", c.env, on, err)
		}
	}
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{nil, "http/protobuf"},
		{map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "grpc"},
		{map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, "http/protobuf"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"},
	} {
		p, err := protocol(envOf(c.env))
		if p != c.want && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%v: protocol %q err %v", c.env, p, err)
		}
	}
}

// Off without an endpoint; on with one, spans reach an OTLP/HTTP
// collector (here a test server) with the service name given.
func TestSetupExportsOverOTLPHTTP(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	tr, _, err := Setup(context.Background(), "kvmesh-test")
	if tr != nil || err != nil {
		t.Fatalf("tracer %v err %v without an endpoint", tr, err)
	}

	got := make(chan []byte, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/v1/traces" && r.Header.Get("Content-Type") == "application/x-protobuf" {
			got <- b
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "none")
	tr, shutdown, err := Setup(context.Background(), "kvmesh-test")
	if err != nil || tr == nil {
		t.Fatalf("tracer %v err %v", tr, err)
	}
	_, sp := tr.Start(context.Background(), "request")
	sp.End()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-got:
		// Protobuf strings are stored as they are.
		for _, want := range []string{"request", "kvmesh-test", Scope} {
			if !strings.Contains(string(b), want) {
				t.Errorf("export lacks %q", want)
			}
		}
	default:
		t.Fatal("no OTLP export reached the collector")
	}
}
