package fleet

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/frontend"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/worker"
)

// spanSet is what one in-memory exporter holds.
type spanSet struct{ exp *tracetest.InMemoryExporter }

func newSpanSet(t *testing.T) (spanSet, trace.Tracer) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return spanSet{exp}, tp.Tracer("test")
}

// named returns the ended spans of trace tid called name.
func (s spanSet) named(tid trace.TraceID, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, sp := range s.exp.GetSpans() {
		if sp.SpanContext.TraceID() == tid && sp.Name == name {
			out = append(out, sp)
		}
	}
	return out
}

func attr(sp tracetest.SpanStub, key string) attribute.Value {
	for _, a := range sp.Attributes {
		if string(a.Key) == key {
			return a.Value
		}
	}
	return attribute.Value{}
}

// byLeg picks the one span of spans whose kvmesh.leg is leg.
func byLeg(t *testing.T, spans []tracetest.SpanStub, leg kv.Leg) tracetest.SpanStub {
	t.Helper()
	var out []tracetest.SpanStub
	for _, sp := range spans {
		if attr(sp, "kvmesh.leg").AsString() == leg.String() {
			out = append(out, sp)
		}
	}
	if len(out) != 1 {
		t.Fatalf("%d spans of leg %s among %d", len(out), leg, len(spans))
	}
	return out[0]
}

// words is n pseudo-random words: a text prompt of about 2n tokens.
func words(seed uint64, n int) string {
	r := rand.New(rand.NewPCG(seed, 7))
	var b strings.Builder
	for range n {
		fmt.Fprintf(&b, "w%d ", r.IntN(100000))
	}
	return b.String()
}

// Traces across the request path: a client's traceparent is the parent of
// the frontend's request span, under which the fleet records tokenize,
// route and worker.generate per leg and the P/D handoff; the workers, with
// a tracer provider of their own, parent their Generate spans to the
// fleet's worker.generate spans from the traceparent that crossed gRPC,
// and record the decode leg's handoff.pull and a hinted prefill's
// hint.fetch under them.
func TestTraceAcrossFrontendFleetWorker(t *testing.T) {
	fe, feTracer := newSpanSet(t)
	ws, wTracer := newSpanSet(t)
	f := startPDWith(t, 2, 1, 0, time.Minute, worker.Config{Tracer: wTracer})
	model, err := frontend.BuiltinModel(pdModel)
	if err != nil {
		t.Fatal(err)
	}
	cfg := frontend.DefaultConfig()
	cfg.Tracer = feTracer
	srv := httptest.NewServer(frontend.New(cfg, f.c, servedModels(model), nil, nil))
	t.Cleanup(srv.Close)

	complete := func(text string, tid trace.TraceID, parent trace.SpanID) {
		t.Helper()
		req, err := http.NewRequest("POST", srv.URL+"/v1/completions",
			strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":4,"seed":1}`, pdModel, text)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("traceparent", fmt.Sprintf("00-%s-%s-01", tid, parent))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	tid := trace.TraceID{0x4b, 0x56, 1}
	client := trace.SpanID{0xc1, 1}
	text1 := words(1, 1500)
	complete(text1, tid, client)

	roots := fe.named(tid, "POST /v1/completions")
	if len(roots) != 1 {
		t.Fatalf("%d request spans in the client's trace", len(roots))
	}
	root := roots[0]
	if root.Parent.SpanID() != client || !root.Parent.IsRemote() || root.SpanKind != trace.SpanKindServer {
		t.Fatalf("request span's parent %v (remote %v), want the client's %v", root.Parent.SpanID(), root.Parent.IsRemote(), client)
	}
	if got := attr(root, "http.response.status_code").AsInt64(); got != 200 {
		t.Errorf("request span status %d", got)
	}
	child := func(name string) []tracetest.SpanStub {
		t.Helper()
		var out []tracetest.SpanStub
		for _, sp := range fe.named(tid, name) {
			if sp.Parent.SpanID() != root.SpanContext.SpanID() {
				t.Errorf("%s's parent is %v, not the request span", name, sp.Parent.SpanID())
			}
			out = append(out, sp)
		}
		return out
	}
	if tok := child("tokenize"); len(tok) != 1 || attr(tok[0], "gen_ai.usage.input_tokens").AsInt64() < 2048 {
		t.Fatalf("tokenize spans: %+v", tok)
	}
	routes, calls := child("route"), child("worker.generate")
	if len(routes) != 2 || len(calls) != 2 {
		t.Fatalf("%d route and %d worker.generate spans, want one of each per leg", len(routes), len(calls))
	}
	byLeg(t, routes, kv.LegPrefill)
	byLeg(t, routes, kv.LegDecode)
	if h := child("disagg.handoff"); len(h) != 1 {
		t.Fatalf("%d handoff spans", len(h))
	}
	// The workers' spans: children of the fleet's client spans, by the
	// traceparent in the gRPC metadata (the workers' tracer provider is
	// not the frontend's).
	var served map[kv.Leg]tracetest.SpanStub
	waitFor(t, 5*time.Second, "both legs' worker spans", func() bool {
		served = map[kv.Leg]tracetest.SpanStub{}
		for _, sp := range ws.named(tid, "kvmesh.api.v1.Worker/Generate") {
			for _, l := range []kv.Leg{kv.LegPrefill, kv.LegDecode} {
				if attr(sp, "kvmesh.leg").AsString() == l.String() {
					served[l] = sp
				}
			}
		}
		return len(served) == 2
	})
	for _, l := range []kv.Leg{kv.LegPrefill, kv.LegDecode} {
		call, sp := byLeg(t, calls, l), served[l]
		if sp.Parent.SpanID() != call.SpanContext.SpanID() || !sp.Parent.IsRemote() || sp.SpanKind != trace.SpanKindServer {
			t.Errorf("%s worker span's parent %v, want the fleet's worker.generate %v", l, sp.Parent.SpanID(), call.SpanContext.SpanID())
		}
		if got := attr(sp, "kvmesh.result").AsString(); got != "finished" {
			t.Errorf("%s worker span result %q", l, got)
		}
	}
	pulls := ws.named(tid, "handoff.pull")
	if len(pulls) != 1 || pulls[0].Parent.SpanID() != served[kv.LegDecode].SpanContext.SpanID() || attr(pulls[0], "kvmesh.blocks.inserted").AsInt64() == 0 {
		t.Fatalf("handoff.pull spans: %+v", pulls)
	}

	// A hinted prefill: the prefill worker that holds turn 1 is full, so
	// the other one is picked and fetches the prefix from it.
	holder := -1
	for i, e := range f.prefill {
		if e.HandoffStats().Prefills == 1 {
			holder = i
		}
	}
	if holder < 0 {
		t.Fatal("no prefill worker served turn 1")
	}
	ids := model.Encode(text1)
	nblocks := len(ids)/sim.DefaultBlockSize - 1 // the last block may tokenize differently when text follows
	local, _ := kv.NewHasher(sim.DefaultBlockSize, "", "").Blocks(ids)
	waitFor(t, 10*time.Second, "index holds turn 1 on the prefill worker", func() bool {
		for _, m := range f.c.index.FindMatches(local, nil) {
			if m.Worker == f.keys[f.prefill[holder]] && int(m.Depth[kv.TierDevice]) >= nblocks {
				return true
			}
		}
		return false
	})
	f.c.router.UpdateLoad(f.keys[f.prefill[holder]], 100, 100, 0, 0)
	tid3 := trace.TraceID{0x4b, 0x56, 3}
	complete(text1+words(3, 1500), tid3, client)
	var fetches []tracetest.SpanStub
	waitFor(t, 5*time.Second, "the hinted prefill's worker span", func() bool {
		fetches = ws.named(tid3, "hint.fetch")
		return len(fetches) == 1 && len(ws.named(tid3, "kvmesh.api.v1.Worker/Generate")) == 2
	})
	pre := byLeg(t, ws.named(tid3, "kvmesh.api.v1.Worker/Generate"), kv.LegPrefill)
	if fetches[0].Parent.SpanID() != pre.SpanContext.SpanID() || attr(fetches[0], "kvmesh.blocks.inserted").AsInt64() < int64(nblocks) {
		t.Fatalf("hint.fetch %+v under %v", fetches[0], pre.SpanContext.SpanID())
	}
	if r := byLeg(t, fe.named(tid3, "route"), kv.LegPrefill); !attr(r, "kvmesh.hint").AsBool() {
		t.Errorf("turn 3's prefill route span has no hint")
	}
}
