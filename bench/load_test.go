package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// fakeReply is how the fake server answers one request.
type fakeReply struct {
	status     int           // non-zero and not 200: reply with it
	hang       bool          // never answer (until the client goes away)
	hangAfter  int           // stream this many tokens, then stall
	first, gap time.Duration // before the first token, between tokens
	tokens     int
	noUsage    bool
	badChunk   bool // a chunk that is not JSON
	errorEvent bool // an OpenAI-style error object in the stream
	truncate   bool // close without [DONE]
}

// fakeOpenAI is an OpenAI-compatible streaming server whose reply to the
// n-th request (0-based, in arrival order) is reply(n).
type fakeOpenAI struct {
	srv    *httptest.Server
	reply  func(n int) fakeReply
	n      atomic.Int64
	mu     sync.Mutex
	bodies []map[string]any
	paths  []string
	onReq  func(n int)
	// metrics, when set, is the text of GET /metrics (a kvmesh server's).
	metrics func() string
}

func newFake(t *testing.T, reply func(n int) fakeReply) *fakeOpenAI {
	f := &fakeOpenAI{reply: reply}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"object":"list","data":[{"id":"fake-model","object":"model"},{"id":"other"}]}`)
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		if f.metrics == nil {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, f.metrics())
	})
	mux.HandleFunc("POST /v1/chat/completions", f.complete)
	mux.HandleFunc("POST /v1/completions", f.complete)
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeOpenAI) url() string { return f.srv.URL + "/v1" }

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (f *fakeOpenAI) complete(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	n := int(f.n.Add(1) - 1)
	f.mu.Lock()
	f.bodies = append(f.bodies, body)
	f.paths = append(f.paths, r.URL.Path)
	f.mu.Unlock()
	if f.onReq != nil {
		f.onReq(n)
	}
	rp := f.reply(n)
	ctx := r.Context()
	if rp.status != 0 && rp.status != 200 {
		http.Error(w, `{"error":{"message":"busy"}}`, rp.status)
		return
	}
	if rp.hang {
		<-ctx.Done()
		return
	}
	chat := strings.HasSuffix(r.URL.Path, "/chat/completions")
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(200)
	fl := w.(http.Flusher)
	send := func(s string) { fmt.Fprintf(w, "data: %s\n\n", s); fl.Flush() }
	if chat {
		send(`{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`)
	}
	fmt.Fprint(w, ": keep-alive comment\n\n")
	if !sleepCtx(ctx, rp.first) {
		return
	}
	for i := 0; i < rp.tokens; i++ {
		if i > 0 && !sleepCtx(ctx, rp.gap) {
			return
		}
		if rp.hangAfter > 0 && i == rp.hangAfter {
			<-ctx.Done()
			return
		}
		if chat {
			send(fmt.Sprintf(`{"choices":[{"index":0,"delta":{"content":"t%d"}}]}`, i))
		} else {
			send(fmt.Sprintf(`{"choices":[{"index":0,"text":"t%d"}]}`, i))
		}
	}
	switch {
	case rp.badChunk:
		send(`{"choices":[`)
	case rp.errorEvent:
		send(`{"error":{"message":"engine died","code":500}}`)
	case rp.truncate:
		return
	}
	if !rp.noUsage {
		send(fmt.Sprintf(`{"choices":[],"usage":{"prompt_tokens":11,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":4}}}`, rp.tokens, rp.tokens+11))
	}
	send("[DONE]")
}

func smallSynth(groups, per, out int) *SyntheticConfig {
	return &SyntheticConfig{Groups: groups, PromptsPerGroup: per, SystemLen: 600, QuestionLen: 40, OutputLen: out}
}

func TestLoadMetricsAgainstFake(t *testing.T) {
	defer goleak.VerifyNone(t)
	const first, gap, tokens = 40 * time.Millisecond, 15 * time.Millisecond, 5
	f := newFake(t, func(int) fakeReply { return fakeReply{first: first, gap: gap, tokens: tokens} })
	out := t.TempDir()
	var stdout, progress bytes.Buffer
	slos, err := ParseSLOs("ttft_ms<=60000,itl_ms<=60000")
	if err != nil {
		t.Fatal(err)
	}
	rep, err := RunLoad(context.Background(), LoadConfig{
		URL: f.url(), Synthetic: smallSynth(2, 3, tokens), Concurrency: 3, Goodput: slos,
		OutDir: out, Progress: &progress, ProgressEvery: 20 * time.Millisecond,
	}, &stdout)
	if err != nil {
		t.Fatal(err)
	}
	f.srv.Close()
	if rep.Requests != 6 || rep.OK != 6 || rep.Failed != 0 || len(rep.Errors) != 0 || rep.Interrupted != "" {
		t.Fatalf("report %+v", rep)
	}
	if rep.Model != "fake-model" {
		t.Fatalf("model %q, want the first of /models", rep.Model)
	}
	msF := func(d time.Duration) float64 { return float64(d) / 1e6 }
	if rep.TTFTms.Count != 6 || rep.TTFTms.Min < msF(first) {
		t.Errorf("TTFT %+v below the server's %v", rep.TTFTms, first)
	}
	// A single client-side gap can be shorter than the server's when the
	// token before it arrived late, so ITL and TTST are checked against each
	// request's own span (below), not against the server's gap.
	if rep.ITLms.Count != 6 || rep.TTSTms.Count != 6 {
		t.Errorf("ITL %+v / TTST %+v: want 6 samples each", rep.ITLms, rep.TTSTms)
	}
	if min := msF(first + (tokens-1)*gap); rep.LatencyMS.Min < min {
		t.Errorf("latency %+v below %v ms", rep.LatencyMS, min)
	}
	if !(rep.TTFTms.Min <= rep.TTFTms.P50 && rep.TTFTms.P50 <= rep.TTFTms.P90 && rep.TTFTms.P90 <= rep.TTFTms.P99 && rep.TTFTms.P99 <= rep.TTFTms.Max) {
		t.Errorf("TTFT percentiles out of order: %+v", rep.TTFTms)
	}
	if rep.OutputTokens.Mean != tokens || rep.OutputTokens.Count != 6 {
		t.Errorf("output tokens %+v", rep.OutputTokens)
	}
	if rep.CachedRatio != 4.0/11 {
		t.Errorf("cached prompt ratio %v, want 4/11 from the usage chunks", rep.CachedRatio)
	}
	// Six requests at concurrency 3 take at least two rounds.
	if min := 2 * msF(first+(tokens-1)*gap) / 1000; rep.DurationS < min {
		t.Errorf("duration %.3f s below %.3f s", rep.DurationS, min)
	}
	if want := 6 * tokens / rep.DurationS; rep.OutputTokS < want*0.999 || rep.OutputTokS > want*1.001 {
		t.Errorf("output tok/s %.2f, want %.2f", rep.OutputTokS, want)
	}
	if want := 6 / rep.DurationS; rep.RequestsPerS < want*0.999 || rep.RequestsPerS > want*1.001 {
		t.Errorf("req/s %.2f, want %.2f", rep.RequestsPerS, want)
	}
	if rep.Goodput.Good != 6 || rep.Goodput.Fraction != 1 {
		t.Errorf("goodput %+v", rep.Goodput)
	}

	// What went over the wire.
	if len(f.bodies) != 6 {
		t.Fatalf("server saw %d requests", len(f.bodies))
	}
	for i, b := range f.bodies {
		if b["stream"] != true || b["model"] != "fake-model" || b["max_tokens"] != float64(tokens) {
			t.Errorf("body %d: %v", i, b)
		}
		if so, _ := b["stream_options"].(map[string]any); so["include_usage"] != true {
			t.Errorf("body %d: stream_options %v", i, b["stream_options"])
		}
		if _, ok := b["min_tokens"]; ok {
			t.Errorf("body %d sends min_tokens without --ignore-eos", i)
		}
		if _, ok := b["ignore_eos"]; ok {
			t.Errorf("body %d sends ignore_eos without --ignore-eos", i)
		}
		msgs, _ := b["messages"].([]any)
		if len(msgs) != 1 || f.paths[i] != "/v1/chat/completions" {
			t.Fatalf("body %d: messages %v path %s", i, msgs, f.paths[i])
		}
		if n := len(strings.Fields(msgs[0].(map[string]any)["content"].(string))); n != 640 {
			t.Errorf("body %d: prompt of %d words, want 640", i, n)
		}
	}

	// Outputs.
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, "load: requests=6 ok=6 ttft_p50_ms=") || !strings.Contains(last, "goodput=1.000") {
		t.Errorf("last stdout line %q", last)
	}
	if !strings.Contains(progress.String(), "progress: 6/6 done") {
		t.Errorf("no final progress line in %q", progress.String())
	}
	var back LoadReport
	raw, err := os.ReadFile(filepath.Join(out, LoadReportFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &back); err != nil || back.OK != 6 || back.TTFTms.P50 != rep.TTFTms.P50 {
		t.Fatalf("report.json: %v %+v", err, back)
	}
	recs, err := os.ReadFile(filepath.Join(out, LoadRecordsFile))
	if err != nil || strings.Count(string(recs), "\n") != 6 {
		t.Fatalf("requests.jsonl: %v\n%s", err, recs)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(recs)), "\n") {
		var r RequestRecord
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		// ITL is the mean gap after the first token; TTST is the first of those gaps.
		span := r.LatencyMS - r.TTFTms
		if d := r.ITLms*float64(tokens-1) - span; d < -1e-6 || d > 1e-6 {
			t.Errorf("record %d: ITL %.3f x %d != latency-TTFT %.3f", r.Index, r.ITLms, tokens-1, span)
		}
		if r.TTSTms <= 0 || r.TTSTms > span+1e-6 {
			t.Errorf("record %d: TTST %.3f outside (0, %.3f]", r.Index, r.TTSTms, span)
		}
	}
	md, err := os.ReadFile(filepath.Join(out, LoadSummaryFile))
	if err != nil || !strings.Contains(string(md), "| ttft_ms | 6 |") {
		t.Fatalf("summary.md: %v\n%s", err, md)
	}
	for _, name := range []string{LoadTTFTPlot, LoadLatencyPlot} {
		checkSVG(t, filepath.Join(out, name))
	}
}

func checkSVG(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(b))
	root := ""
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s is not XML: %v", path, err)
		}
		if se, ok := tok.(xml.StartElement); ok && root == "" {
			root = se.Name.Local
		}
	}
	if root != "svg" {
		t.Fatalf("%s: root %q", path, root)
	}
}

func TestLoadCompletionsIgnoreEOSAndNoUsage(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := newFake(t, func(int) fakeReply { return fakeReply{tokens: 4, noUsage: true} })
	var stdout bytes.Buffer
	rep, err := RunLoad(context.Background(), LoadConfig{
		URL: f.srv.URL, Model: "m", Endpoint: "completions", IgnoreEOS: true,
		Synthetic: smallSynth(1, 2, 4), Rate: 1000,
	}, &stdout)
	if err != nil {
		t.Fatal(err)
	}
	f.srv.Close()
	if rep.OK != 2 || rep.OutputTokens.Mean != 4 {
		t.Fatalf("ok %d, output tokens %+v (counted from chunks without usage)", rep.OK, rep.OutputTokens)
	}
	for i, b := range f.bodies {
		if f.paths[i] != "/v1/completions" || b["prompt"] == nil || b["messages"] != nil {
			t.Errorf("request %d to %s: %v", i, f.paths[i], b)
		}
		if b["min_tokens"] != float64(4) || b["ignore_eos"] != true || b["model"] != "m" {
			t.Errorf("request %d: %v", i, b)
		}
	}
}

func TestLoadErrorsCountedByStatus(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := newFake(t, func(n int) fakeReply {
		switch n % 4 {
		case 1:
			return fakeReply{status: 503}
		case 2:
			return fakeReply{status: 500}
		}
		return fakeReply{tokens: 2}
	})
	slos, _ := ParseSLOs("ttft_ms<=100000")
	rep, err := RunLoad(context.Background(), LoadConfig{URL: f.url(), Model: "m", Synthetic: smallSynth(3, 4, 2), Concurrency: 4, Goodput: slos}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	f.srv.Close()
	if rep.Requests != 12 || rep.OK != 6 || rep.Failed != 6 || rep.Errors["http_503"] != 3 || rep.Errors["http_500"] != 3 || rep.Rejected != 3 {
		t.Fatalf("requests %d ok %d failed %d errors %v rejected %d", rep.Requests, rep.OK, rep.Failed, rep.Errors, rep.Rejected)
	}
	if rep.Goodput.Good != 6 || rep.Goodput.Fraction != 0.5 {
		t.Fatalf("goodput %+v: failed requests are never good", rep.Goodput)
	}
	for _, r := range rep.Records() {
		if !r.OK && (r.Status != 500 && r.Status != 503 || !strings.Contains(r.Detail, "busy")) {
			t.Fatalf("record %+v", r)
		}
	}
}

func TestLoadTimeoutsDoNotHang(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := newFake(t, func(n int) fakeReply {
		switch n % 3 {
		case 0:
			return fakeReply{hang: true}
		case 1:
			return fakeReply{tokens: 5, hangAfter: 2}
		}
		return fakeReply{tokens: 3}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := RunLoad(ctx, LoadConfig{URL: f.url(), Model: "m", Synthetic: smallSynth(2, 3, 3), Concurrency: 6, Timeout: 150 * time.Millisecond}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	f.srv.Close()
	if rep.Interrupted != "" || ctx.Err() != nil {
		t.Fatal("the run needed the test's guard deadline")
	}
	if rep.OK != 2 || rep.Errors[ErrTimeout] != 4 {
		t.Fatalf("ok %d errors %v", rep.OK, rep.Errors)
	}
	for _, r := range rep.Records() {
		if r.Error == ErrTimeout && (r.EndS-r.StartS)*1000 < 150 {
			t.Fatalf("timed out after %.1f ms, before the timeout", (r.EndS-r.StartS)*1000)
		}
	}
}

func TestLoadStreamErrors(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := newFake(t, func(n int) fakeReply {
		switch n % 4 {
		case 0:
			return fakeReply{tokens: 2, badChunk: true}
		case 1:
			return fakeReply{tokens: 2, errorEvent: true}
		case 2:
			return fakeReply{tokens: 2, truncate: true}
		}
		return fakeReply{tokens: 0}
	})
	rep, err := RunLoad(context.Background(), LoadConfig{URL: f.url(), Model: "m", Synthetic: smallSynth(2, 4, 2), Concurrency: 2}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	f.srv.Close()
	if rep.OK != 0 || rep.Errors[ErrStream] != 6 || rep.Errors[ErrEmpty] != 2 {
		t.Fatalf("errors %v", rep.Errors)
	}
}

func TestLoadConnectionRefused(t *testing.T) {
	defer goleak.VerifyNone(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	rep, err := RunLoad(context.Background(), LoadConfig{URL: "http://" + addr + "/v1", Model: "m", Synthetic: smallSynth(1, 3, 2), Concurrency: 1}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Errors[ErrConnectionRefused] != 3 {
		t.Fatalf("errors %v", rep.Errors)
	}
	// Without --model the /models lookup fails with a clear error.
	_, err = RunLoad(context.Background(), LoadConfig{URL: "http://" + addr + "/v1", Synthetic: smallSynth(1, 3, 2), Concurrency: 1}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "/models") {
		t.Fatalf("err %v", err)
	}
}

// Cancellation stops sending; in-flight requests that outlive the grace
// period are cancelled, and the partial report is printed and written.
func TestLoadCancelPrintsPartialReport(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFake(t, func(n int) fakeReply {
		if n < 2 {
			return fakeReply{tokens: 2}
		}
		return fakeReply{tokens: 5, hangAfter: 1}
	})
	f.onReq = func(n int) {
		if n == 3 {
			cancel()
		}
	}
	out := t.TempDir()
	var stdout bytes.Buffer
	rep, err := RunLoad(ctx, LoadConfig{URL: f.url(), Model: "m", Synthetic: smallSynth(2, 5, 5), Concurrency: 2, Grace: 100 * time.Millisecond, OutDir: out}, &stdout)
	if err != nil {
		t.Fatal(err)
	}
	f.srv.Close()
	if rep.Interrupted != "cancelled" || rep.OK != 2 || rep.Errors[ErrCanceled] != 2 || rep.NotSent != 6 || rep.Planned != 10 {
		t.Fatalf("interrupted %q ok %d errors %v not sent %d", rep.Interrupted, rep.OK, rep.Errors, rep.NotSent)
	}
	s := stdout.String()
	if !strings.Contains(s, "INTERRUPTED") || !strings.Contains(s, "load: requests=4 ok=2 ") {
		t.Fatalf("summary:\n%s", s)
	}
	checkSVG(t, filepath.Join(out, LoadLatencyPlot))
	if md, _ := os.ReadFile(filepath.Join(out, LoadSummaryFile)); !bytes.Contains(md, []byte("interrupted")) {
		t.Fatal("summary.md does not say the run was interrupted")
	}
}

// Requests in flight at cancellation that finish within the grace period
// count as successes.
func TestLoadCancelLetsInFlightFinish(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFake(t, func(n int) fakeReply {
		return fakeReply{tokens: 3, first: 30 * time.Millisecond, gap: 10 * time.Millisecond}
	})
	f.onReq = func(n int) {
		if n == 3 {
			cancel()
		}
	}
	rep, err := RunLoad(ctx, LoadConfig{URL: f.url(), Model: "m", Synthetic: smallSynth(2, 5, 3), Concurrency: 2, Grace: 20 * time.Second}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	f.srv.Close()
	if rep.Interrupted != "cancelled" || rep.OK != 4 || rep.Failed != 0 || rep.NotSent != 6 {
		t.Fatalf("interrupted %q ok %d errors %v not sent %d", rep.Interrupted, rep.OK, rep.Errors, rep.NotSent)
	}
}

func TestLoadOverallDeadline(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := newFake(t, func(n int) fakeReply { return fakeReply{tokens: 2, first: 20 * time.Millisecond} })
	rep, err := RunLoad(context.Background(), LoadConfig{URL: f.url(), Model: "m", Synthetic: smallSynth(10, 10, 2), Rate: 20, Duration: 150 * time.Millisecond}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	f.srv.Close()
	if rep.Interrupted == "" || rep.NotSent == 0 || rep.Requests == 0 || rep.OK != rep.Requests {
		t.Fatalf("interrupted %q sent %d ok %d not sent %d", rep.Interrupted, rep.Requests, rep.OK, rep.NotSent)
	}
}

func writeTrace(t *testing.T, lines ...string) string {
	p := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadTraceReplay(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := newFake(t, func(int) fakeReply { return fakeReply{tokens: 2} })
	path := writeTrace(t,
		`{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}`,
		`{"timestamp": 40, "input_length": 700, "output_length": 3, "hash_ids": [1, 3]}`,
		`not json`,
		`{"timestamp": 80, "input_length": 100, "output_length": 0, "hash_ids": [4]}`,
		`{"timestamp": 90, "input_length": 100, "output_length": 2, "hash_ids": [4]}`,
	)
	var log bytes.Buffer
	rep, err := RunLoad(context.Background(), LoadConfig{URL: f.url(), Model: "m", TracePath: path, Speedup: 2, Requests: 3, Log: &log}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	f.srv.Close()
	if !strings.Contains(log.String(), "line 3") || rep.TraceErrors != 1 {
		t.Fatalf("malformed line not reported: %q", log.String())
	}
	if rep.Planned != 3 || rep.OK != 3 {
		t.Fatalf("planned %d ok %d", rep.Planned, rep.OK)
	}
	recs := rep.Records()
	// Open loop on timestamps ÷ 2: the second request is not sent before 20 ms.
	if recs[1].StartS < 0.020 || recs[2].StartS < 0.040 || recs[2].TraceLine != 4 {
		t.Fatalf("send times %.4f %.4f (line %d)", recs[1].StartS, recs[2].StartS, recs[2].TraceLine)
	}
	prompts := map[float64]string{}
	for _, b := range f.bodies {
		msgs := b["messages"].([]any)
		words := strings.Fields(msgs[0].(map[string]any)["content"].(string))
		prompts[float64(len(words))] = strings.Join(words, " ")
		if len(words) == 100 && b["max_tokens"] != float64(1) {
			t.Errorf("output_length 0 sent as max_tokens %v, want 1", b["max_tokens"])
		}
	}
	a, b := strings.Fields(prompts[600]), strings.Fields(prompts[700])
	if len(a) != 600 || len(b) != 700 {
		t.Fatalf("prompt lengths %d %d", len(a), len(b))
	}
	if strings.Join(a[:512], " ") != strings.Join(b[:512], " ") {
		t.Fatal("shared hash id 1 did not give a shared 512-word prefix")
	}
	if strings.Join(a[512:], " ") == strings.Join(b[512:512+88], " ") {
		t.Fatal("different hash ids gave the same block")
	}

	if _, err := RunLoad(context.Background(), LoadConfig{URL: f.url(), Model: "m", TracePath: path, Strict: true}, io.Discard); err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Fatalf("strict: %v", err)
	}
}

func TestLoadProgressTTY(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := newFake(t, func(int) fakeReply { return fakeReply{tokens: 2, first: 100 * time.Millisecond} })
	var progress bytes.Buffer
	_, err := RunLoad(context.Background(), LoadConfig{URL: f.url(), Model: "m", Synthetic: smallSynth(1, 4, 2), Concurrency: 2, Progress: &progress, ProgressTTY: true}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	f.srv.Close()
	p := progress.String()
	if !strings.Contains(p, "\r\x1b[K[") || !strings.Contains(p, "[##############################] 4/4 done") {
		t.Fatalf("progress %q", p)
	}
	sc := bufio.NewScanner(strings.NewReader(p))
	lines := 0
	for sc.Scan() {
		lines++
	}
	if lines != 1 {
		t.Fatalf("a TTY bar should redraw one line, got %d", lines)
	}
}

func TestLoadConfigErrors(t *testing.T) {
	s := smallSynth(1, 1, 1)
	for name, c := range map[string]LoadConfig{
		"no url":         {Synthetic: s, Concurrency: 1},
		"bad url":        {URL: "ftp://x", Synthetic: s, Concurrency: 1},
		"no workload":    {URL: "http://x"},
		"two workloads":  {URL: "http://x", Synthetic: s, TracePath: "t", Concurrency: 1},
		"both loops":     {URL: "http://x", Synthetic: s, Concurrency: 1, Rate: 1},
		"synth no loop":  {URL: "http://x", Synthetic: s},
		"bad endpoint":   {URL: "http://x", Synthetic: s, Concurrency: 1, Endpoint: "embeddings"},
		"bad speedup":    {URL: "http://x", TracePath: "t", Speedup: -1},
		"bad synthetic":  {URL: "http://x", Synthetic: &SyntheticConfig{Groups: 1}, Concurrency: 1},
		"missing trace":  {URL: "http://x", TracePath: filepath.Join(t.TempDir(), "none.jsonl"), Model: "m"},
		"negative value": {URL: "http://x", Synthetic: s, Concurrency: -1},
	} {
		if _, err := RunLoad(context.Background(), c, io.Discard); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestParseSLOs(t *testing.T) {
	s, err := ParseSLOs("ttft_ms<=2000, itl_ms<=25")
	if err != nil || len(s) != 2 || s[0] != (SLO{"ttft_ms", "<=", 2000}) || s[1] != (SLO{"itl_ms", "<=", 25}) {
		t.Fatalf("%v %v", s, err)
	}
	s, err = ParseSLOs("time_to_first_token:5000 inter_token_latency:100 output_token_throughput_per_user:20")
	if err != nil || len(s) != 3 || s[1].Metric != "itl_ms" || s[2] != (SLO{"tps_user", ">=", 20}) {
		t.Fatalf("aiperf form: %v %v", s, err)
	}
	for _, bad := range []string{"foo<=1", "ttft<=abc", "ttft", "ttft<=-1", ",", "itl_ms<=NaN"} {
		if _, err := ParseSLOs(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if s, err := ParseSLOs(""); err != nil || s != nil {
		t.Fatal("empty spec is not 'no SLO'")
	}
}

func TestGoodputAndStats(t *testing.T) {
	slos, _ := ParseSLOs("ttft_ms<=100,itl_ms<=10")
	c := &LoadConfig{URL: "http://x/v1", Goodput: slos, Concurrency: 1}
	recs := []RequestRecord{
		{OK: true, TTFTms: 50, ITLms: 5, HasITL: true, OutputTokens: 10, LatencyMS: 95, StartS: 0, EndS: 0.1},   // good
		{OK: true, TTFTms: 150, ITLms: 5, HasITL: true, OutputTokens: 10, LatencyMS: 195, StartS: 1, EndS: 1.2}, // slow first token
		{OK: true, TTFTms: 90, ITLms: 11, HasITL: true, OutputTokens: 10, LatencyMS: 189, StartS: 2, EndS: 2.2}, // slow decode
		{OK: true, TTFTms: 100, OutputTokens: 1, LatencyMS: 100, StartS: 3, EndS: 3.1},                          // good, no ITL
		{Error: "http_429", Status: 429, StartS: 3.5, EndS: 4},                                                  // failed
	}
	rep := buildReport(c, recs, 6)
	if rep.Goodput.Good != 2 || rep.Goodput.Fraction != 0.4 || rep.DurationS != 4 || rep.Goodput.PerS != 0.5 {
		t.Fatalf("goodput %+v duration %v", rep.Goodput, rep.DurationS)
	}
	if rep.Rejected != 1 || rep.Errors["http_429"] != 1 || rep.NotSent != 1 || rep.OK != 4 {
		t.Fatalf("%+v", rep)
	}
	if rep.TTFTms.Min != 50 || rep.TTFTms.Max != 150 || rep.TTFTms.Mean != 97.5 || rep.TTFTms.P50 != 95 {
		t.Fatalf("ttft %+v", rep.TTFTms)
	}
	if rep.ITLms.Count != 3 || rep.OutputTokS != 31.0/4 {
		t.Fatalf("itl %+v, output tok/s %v", rep.ITLms, rep.OutputTokS)
	}
	// A one-token answer has no second token: a TTST SLO cannot fail it.
	ttst := SLO{"ttst_ms", "<=", 1}
	if !ttst.met(&RequestRecord{OK: true, OutputTokens: 1}) || ttst.met(&RequestRecord{OK: true, HasTTST: true, TTSTms: 2}) {
		t.Fatal("ttst SLO")
	}
	// numpy: percentile([1..10], 90) = 9.1, 99 -> 9.91.
	v := []float64{10, 9, 8, 7, 6, 5, 4, 3, 2, 1}
	st := newStats(v)
	if st.P50 != 5.5 || abs(st.P90-9.1) > 1e-9 || abs(st.P99-9.91) > 1e-9 || v[0] != 10 {
		t.Fatalf("stats %+v", st)
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// BenchmarkLoadLoopback measures the generator's own ceiling: requests/s
// it sustains against an instant loopback fake (16 tokens each).
func BenchmarkLoadLoopback(b *testing.B) {
	f := &fakeOpenAI{reply: func(int) fakeReply { return fakeReply{tokens: 16} }}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", f.complete)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	b.ResetTimer()
	rep, err := RunLoad(context.Background(), LoadConfig{URL: srv.URL + "/v1", Model: "m",
		Synthetic: &SyntheticConfig{Groups: 1, PromptsPerGroup: b.N, SystemLen: 512, QuestionLen: 64, OutputLen: 16}, Concurrency: 32}, io.Discard)
	if err != nil || rep.OK != b.N {
		b.Fatalf("ok %d of %d: %v", rep.OK, b.N, err)
	}
	b.ReportMetric(rep.RequestsPerS, "req/s")
	b.ReportMetric(rep.OutputTokS, "tok/s")
}

// BenchmarkPromptText measures building a 12k-token prompt (the
// conversation trace's mean input) from hash ids.
func BenchmarkPromptText(b *testing.B) {
	segs := make([]segment, 24)
	for i := range segs {
		segs[i] = segment{ID: uint64(i), Tokens: 512}
	}
	b.SetBytes(int64(24 * 512))
	for b.Loop() {
		_ = promptText(segs)
	}
}
