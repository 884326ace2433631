package main

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// collector is an OTLP/HTTP trace receiver: it keeps every span it is sent
// and the service names they came from.
type collector struct {
	mu       sync.Mutex
	spans    []*tracepb.Span
	services map[string]bool
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	var req coltracepb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(b, &req)
	}
	if r.URL.Path != "/v1/traces" || err != nil {
		http.Error(w, fmt.Sprint(r.URL.Path, err), 400)
		return
	}
	c.mu.Lock()
	for _, rs := range req.ResourceSpans {
		for _, a := range rs.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				c.services[a.GetValue().GetStringValue()] = true
			}
		}
		for _, ss := range rs.ScopeSpans {
			c.spans = append(c.spans, ss.Spans...)
		}
	}
	c.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// named returns the spans of trace tid called name.
func (c *collector) named(tid []byte, name string) []*tracepb.Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range c.spans {
		if bytes.Equal(s.TraceId, tid) && s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// kvmesh serve with the standard OTEL_* variables sends a request's spans
// to an OTLP/HTTP collector: the request span is the child of the client's
// traceparent, and the worker's Generate span (across gRPC on loopback)
// the child of the fleet's worker.generate span.
func TestServeExportsTraces(t *testing.T) {
	col := &collector{services: map[string]bool{}}
	srv := httptest.NewServer(col)
	defer srv.Close()
	p := testutil.Start(t, "kvmesh serve", testutil.Binary(t), []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + srv.URL,
		"OTEL_SERVICE_NAME=kvmesh-e2e", "OTEL_BSP_SCHEDULE_DELAY=100"},
		"serve", "--listen", "127.0.0.1:0", "--log-level", "warn", "--workers", "1")
	m := p.Expect(serveLine, 30*time.Second)
	s := &served{Proc: p, base: m[1], natsURL: m[2]}
	defer s.stop(t)

	tid := []byte{0x4b, 0x56, 0x6d, 0x65, 0x73, 0x68, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}
	parent := []byte{0xc1, 0, 0, 0, 0, 0, 0, 1}
	req, _ := http.NewRequest("POST", s.base+"/chat/completions",
		strings.NewReader(`{"model":"kvmesh-sim","messages":[{"role":"user","content":"trace me"}],"max_tokens":4,"stream":true}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", fmt.Sprintf("00-%x-%x-01", tid, parent))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	testutil.WaitFor(t, 10*time.Second, "the request's spans at the collector", func() bool {
		return len(col.named(tid, "POST /v1/chat/completions")) == 1 && len(col.named(tid, "kvmesh.api.v1.Worker/Generate")) == 1
	})
	root := col.named(tid, "POST /v1/chat/completions")[0]
	if !bytes.Equal(root.ParentSpanId, parent) || root.Kind != tracepb.Span_SPAN_KIND_SERVER {
		t.Errorf("request span's parent %x kind %v, want the client's %x", root.ParentSpanId, root.Kind, parent)
	}
	for _, name := range []string{"tokenize", "route", "worker.generate"} {
		if sp := col.named(tid, name); len(sp) != 1 || !bytes.Equal(sp[0].ParentSpanId, root.SpanId) {
			t.Errorf("%s: %d spans, want one under the request span", name, len(sp))
		}
	}
	call := col.named(tid, "worker.generate")
	if w := col.named(tid, "kvmesh.api.v1.Worker/Generate")[0]; len(call) == 1 && !bytes.Equal(w.ParentSpanId, call[0].SpanId) {
		t.Errorf("worker span's parent %x, want worker.generate %x", w.ParentSpanId, call[0].SpanId)
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	if !col.services["kvmesh-e2e"] {
		t.Errorf("service names %v, want OTEL_SERVICE_NAME's", col.services)
	}
}
