package frontend

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/kvmesh/kvmesh/tokenizer"
)

// The frontend's own cost per streamed chat request, without a network:
// parse, chat template, tokenize, route to a backend that answers at once,
// render every SSE event. The token-path cost is reported per token.
//
//	go test ./frontend -run '^$' -bench ChatStream -benchmem
func BenchmarkChatStreamHandler(b *testing.B) {
	for _, tokens := range []int{1, 64} {
		b.Run(strconv.Itoa(tokens)+"tok", func(b *testing.B) {
			reg := prometheus.NewRegistry()
			s := New(DefaultConfig(), &fakeBackend{reply: strings.Repeat("x", tokens)}, models{testModel()}, reg, reg)
			body := `{"model":"test-model","stream":true,"max_tokens":` + strconv.Itoa(tokens) + `,"messages":[{"role":"user","content":"tell me something about latency"}]}`
			b.ReportAllocs()
			serveChatLoop(b, s, body)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*tokens), "ns/token")
		})
	}
}

// BenchmarkChatStreamHandlerLongPrompt: one token after a 32k-token prompt
// (the test model makes a token of every byte), where the frontend's
// per-token costs of the prompt (encoding, copies) show.
func BenchmarkChatStreamHandlerLongPrompt(b *testing.B) {
	reg := prometheus.NewRegistry()
	s := New(DefaultConfig(), &fakeBackend{reply: "x"}, models{testModel()}, reg, reg)
	body := `{"model":"test-model","stream":true,"max_tokens":1,"messages":[{"role":"user","content":"` + strings.Repeat("latency ", 4096) + `"}]}`
	b.ReportAllocs()
	serveChatLoop(b, s, body)
}

// serveChatLoop serves body as a chat request once per benchmark iteration.
func serveChatLoop(b *testing.B, s *Server, body string) {
	b.Helper()
	for b.Loop() {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
		s.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
}

// The same over loopback HTTP/1.1 with Go's client, one stream at a time:
// what net/http and the kernel add to the handler's own cost.
func BenchmarkChatStreamLoopback(b *testing.B) {
	for _, tokens := range []int{1, 64} {
		b.Run(strconv.Itoa(tokens)+"tok", func(b *testing.B) {
			reg := prometheus.NewRegistry()
			s := New(DefaultConfig(), &fakeBackend{reply: strings.Repeat("x", tokens)}, models{testModel()}, reg, reg)
			ts := httptest.NewServer(s)
			defer ts.Close()
			hc := ts.Client()
			body := []byte(`{"model":"test-model","stream":true,"max_tokens":` + strconv.Itoa(tokens) + `,"messages":[{"role":"user","content":"tell me something about latency"}]}`)
			b.ReportAllocs()
			for b.Loop() {
				resp, err := hc.Post(ts.URL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				sc := bufio.NewScanner(resp.Body)
				events := 0
				for sc.Scan() {
					if len(sc.Bytes()) > 0 {
						events++
					}
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if events < tokens+2 {
					b.Fatalf("%d events for %d tokens", events, tokens)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*tokens), "ns/token")
		})
	}
}

// BenchmarkChatStreamHandlerTracing: one streamed token with tracing off
// (Config.Tracer nil: no span, no allocation) and on (an SDK tracer that
// samples everything, spans dropped by a no-op exporter): what the request
// and tokenize spans cost the frontend.
//
//	go test ./frontend -run '^$' -bench ChatStreamHandlerTracing -benchmem -count 3
func BenchmarkChatStreamHandlerTracing(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := map[bool]string{false: "off", true: "on"}[on]
		b.Run(name, func(b *testing.B) {
			reg := prometheus.NewRegistry()
			cfg := DefaultConfig()
			if on {
				tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(discardSpans{}))
				defer tp.Shutdown(context.Background())
				cfg.Tracer = tp.Tracer("bench")
			}
			s := New(cfg, &fakeBackend{reply: "x"}, models{testModel()}, reg, reg)
			body := `{"model":"test-model","stream":true,"max_tokens":1,"messages":[{"role":"user","content":"tell me something about latency"}]}`
			b.ReportAllocs()
			serveChatLoop(b, s, body)
		})
	}
}

// discardSpans is an exporter that drops what it is given.
type discardSpans struct{}

func (discardSpans) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardSpans) Shutdown(context.Context) error                             { return nil }

// BenchmarkChatTurns is the frontend's cost of one turn of a growing
// conversation (a question and an answer of ~700 tokens a turn, built-in
// o200k tokenizer and ChatML): parse, template, tokenize, a backend that
// answers at once. whole: no prefix cache; cached: the cache holds the
// turn before's prompt (as when the client sent it); answered: it also
// holds that turn's answer, kept after the answer ended (as when kvmesh
// generated the answer the client resends), so the turn tokenizes only
// its new question; memo: answered, and the chat memo holds the turn
// before's body, so the turn parses, renders and scans only its new
// messages. All but memo run without the chat memo.
//
//	go test ./frontend -run '^$' -bench ChatTurns
func BenchmarkChatTurns(b *testing.B) {
	m, err := BuiltinModel("test-model")
	if err != nil {
		b.Fatal(err)
	}
	tok := tokenizerOf(b)
	eos, _ := tok.TokenID("<|im_end|>")
	be := &answerBackend{ids: []uint32{120}, eos: eos}
	reg := prometheus.NewRegistry()
	s := New(DefaultConfig(), be, models{m}, reg, reg)
	var bodies, open, answers []string
	history := ""
	para := func(turn int, who string) string {
		var sb strings.Builder
		for i := range 90 {
			sb.WriteString(who + " " + strconv.Itoa(turn*1000+i) + " is " + strconv.Itoa(i*7) + ", ")
		}
		return sb.String()
	}
	for turn := range 16 {
		if history != "" {
			history += ","
		}
		history += `{"role":"user","content":"` + para(turn, "question") + `"}`
		// Timed turns stop at one token (no end token: nothing kept); the
		// turn before an answered one runs to its end token.
		// Messages first (the OpenAI client's order): a timed turn's body
		// starts with the bytes of the turn before's, whatever max_tokens.
		bodies = append(bodies, `{"messages":[`+history+`],"model":"test-model","stream":true,"max_tokens":1}`)
		open = append(open, `{"messages":[`+history+`],"model":"test-model","stream":true,"max_tokens":4096}`)
		answers = append(answers, para(turn, "answer"))
		history += `,{"role":"assistant","content":"` + para(turn, "answer") + `"}`
	}
	serveOnce := func(body string) {
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)))
		if w.Code != http.StatusOK {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
	for _, turn := range []int{1, 2, 4, 8, 16} {
		for _, mode := range []string{"whole", "cached", "answered", "memo"} {
			if turn == 1 && (mode == "answered" || mode == "memo") {
				continue
			}
			b.Run("turn="+strconv.Itoa(turn)+"/"+mode, func(b *testing.B) {
				var cpu time.Duration
				n := 0
				for b.Loop() {
					b.StopTimer()
					m.prefixCache = nil
					s.memo = nil
					if mode == "memo" {
						s.memo = newChatMemo(chatMemoBytes)
					}
					if mode != "whole" {
						m.prefixCache = tokenizer.NewPrefixCache(tok, PrefixCacheTokens)
						m.prefixCache.Verify(0) // as after its first hits
					}
					switch {
					case turn > 1 && mode == "cached":
						serveOnce(bodies[turn-2])
					case turn > 1 && (mode == "answered" || mode == "memo"):
						be.ids = tok.Encode(answers[turn-2])
						serveOnce(open[turn-2])
						be.ids = []uint32{120}
					}
					cpu0 := processCPU()
					b.StartTimer()
					// Labelled: go tool pprof -tagfocus turn=timed.
					pprof.Do(context.Background(), pprof.Labels("turn", "timed"), func(context.Context) { serveOnce(bodies[turn-1]) })
					b.StopTimer()
					cpu += processCPU() - cpu0
					n++
					b.StartTimer()
				}
				// The process's CPU per timed turn: steadier than ns/op on a
				// shared box (a wait for a core is not counted).
				b.ReportMetric(float64(cpu.Microseconds())/float64(max(n, 1)), "cpu-µs/op")
			})
		}
	}
}

// processCPU is the process's CPU time so far (every goroutine's, GC's).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func tokenizerOf(b *testing.B) tokenizer.Tokenizer {
	tok, _, err := tokenizer.Builtin()
	if err != nil {
		b.Fatal(err)
	}
	return tok
}
