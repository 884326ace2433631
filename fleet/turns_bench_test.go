package fleet

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/frontend"
	"github.com/kvmesh/kvmesh/internal/stages"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/tokenizer"
	"github.com/kvmesh/kvmesh/worker"
	"github.com/kvmesh/kvmesh/workerclient"
)

// BenchmarkServeTurns is kvmesh's cost of one turn of a growing
// conversation through the whole of `serve`: the HTTP handler, the
// router (hash, index, choice), an in-process worker and a simulated
// engine that takes no time (--speedup-ratio 0), one streamed token. A
// turn adds a user message and an assistant answer of ~700 o200k tokens
// each: turn 1's prompt is 639 tokens, turn 16's 22.3k (a 60 KB body).
//
// cold: the turn's conversation is new to kvmesh (a fresh cache_salt, so
// neither the prefix-tokenization cache nor the engine holds any of it);
// warm: the turn before was just served under the same salt, as a client
// sends it. Besides ns/op it reports the request path's stages (means of
// kvmesh_request_stage_seconds over the timed requests, µs): own-µs sums
// kvmesh's own (read_body … dispatch, worker_admit, first_write), engine-µs
// is the simulated engine's time to its first output; cpu-µs/op is the
// process's CPU time over the timed request (every goroutine's, GC's too:
// steadier than ns/op on a shared box), alloc-KB/op what it allocated,
// gc-ns/KB the collector's CPU per KB allocated over the whole run (each
// own stage's mean is reported too);
// own-p50-µs and cpu-p50-µs are the medians per request, reused-tokens the
// prompt tokens the prefix cache gave. Each timed turn comes 5 ms after the
// turn before (settle).
//
// played/turn=k is the same cost for a conversation as a client plays it
// (played, below): the answers resent exactly as they were streamed, so
// the frontend kept them; turn 1 is a new conversation.
//
//	go test ./fleet -run '^$' -bench ServeTurns -benchtime 30x
func BenchmarkServeTurns(b *testing.B) {
	ctx, nc, disc := controlPlane(b, 10*time.Second)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reg := prometheus.NewRegistry()
	cfg := sim.DefaultConfig()
	cfg.SpeedupRatio = 0
	cfg.Blocks = 1 << 17 // every salt's conversation fits
	cfg.MaxBatchedTokens = 1 << 16
	// Answers in plain words that the end token ends after ~700 tokens on
	// average (it is drawn like any word), as a chat model's do.
	tok, _, err := tokenizer.Builtin()
	if err != nil {
		b.Fatal(err)
	}
	words := tokenizer.PlainWordTokens(tok)
	end, _ := tok.TokenID("<|im_end|>")
	cfg.VocabSize = tok.VocabSize() // the end token is one of the added tokens past 200k
	cfg.OutputTokens = append(words, slices.Repeat([]uint32{end}, max(len(words)/700, 1))...)
	eng, err := sim.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	w := startWorker(b, ctx, nc, eng, worker.Config{Registerer: reg})
	model, err := frontend.BuiltinModel(cfg.Model)
	if err != nil {
		b.Fatal(err)
	}
	cl, err := New(ctx, Config{NC: nc, Discovery: disc, Models: []string{cfg.Model}, Local: []workerclient.Local{w.Local()},
		Router: router.Config{Mode: router.ModeKV}, Registerer: reg, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	waitFor(b, 10*time.Second, "the cluster sees the worker", func() bool { return len(cl.router.Workers(cfg.Model, kv.RoleAggregated)) == 1 })
	var models frontend.StaticModels
	models.Add(model)
	fcfg := frontend.DefaultConfig()
	fcfg.Logger = slog.New(slog.DiscardHandler)
	srv := frontend.New(fcfg, cl, &models, reg, reg)

	conv := conversation(16)
	serveBody := func(turn int, body string) {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
		srv.ServeHTTP(w, r)
		if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "[DONE]") {
			b.Fatalf("turn %d: status %d: %.300s", turn, w.Code, w.Body)
		}
	}
	serveTurn := func(turn int, salt string) { serveBody(turn, conv.body(turn, cfg.Model, salt)) }
	// The prefix cache checks its first hits against a whole tokenization;
	// they are spent here, as a running server spends them at its start.
	for i := range 20 {
		serveTurn(1, "warmup-"+strconv.Itoa(i))
		serveTurn(2, "warmup-"+strconv.Itoa(i))
	}
	if st := model.PrefixStats(); st.Off || st.Hits < 20 {
		b.Fatalf("prefix cache after the warm-up: %+v", st)
	}
	serial := 0
	// measure times one request per iteration: prepare (untimed) serves what
	// comes before it under a fresh salt and returns the timed body.
	measure := func(b *testing.B, turn int, prepare func(salt string) string) {
		var sums stageSums
		var cpu time.Duration
		var alloc, bodyBytes uint64
		var reused int64
		var owns, cpus []float64
		n := 0
		gc0, all0 := gcCPU(), heapAllocs()
		for b.Loop() {
			b.StopTimer()
			serial++
			body := prepare("conv-" + strconv.Itoa(serial))
			// A client's next turn comes after it read the answer: what the
			// turn before left running (the engine's KV events through the
			// relay into the index) is done by then.
			time.Sleep(settle)
			before := readStages(b, reg)
			reused0 := model.PrefixStats().Reused
			cpu0, alloc0 := processCPU(), heapAllocs()
			b.StartTimer()
			// Labelled, so a CPU profile can show the timed turns alone
			// (go tool pprof -tagfocus turn=timed).
			pprof.Do(ctx, timedLabel, func(context.Context) { serveBody(turn, body) })
			b.StopTimer()
			dcpu := processCPU() - cpu0
			cpu += dcpu
			cpus = append(cpus, float64(dcpu.Microseconds()))
			alloc += heapAllocs() - alloc0
			bodyBytes += uint64(len(body))
			reused += model.PrefixStats().Reused - reused0
			after := readStages(b, reg)
			sums.add(after, before)
			own := 0.0
			for _, k := range ownStages {
				own += (after[k] - before[k]) * 1e6
			}
			owns = append(owns, own)
			n++
			b.StartTimer()
		}
		if n > 0 {
			// Medians too: one request that waited for a core (a shared box)
			// moves a mean, not a median.
			b.ReportMetric(median(owns), "own-p50-µs")
			b.ReportMetric(median(cpus), "cpu-p50-µs")
		}
		sums.report(b, n)
		if all := heapAllocs() - all0; all > 0 {
			// The collector's CPU per KB allocated over the whole run
			// (untimed turns too): what each allocated byte costs.
			b.ReportMetric(float64(gcCPU()-gc0)/float64(all)*1024, "gc-ns/KB")
		}
		if n > 0 {
			b.ReportMetric(float64(cpu.Microseconds())/float64(n), "cpu-µs/op")
			b.ReportMetric(float64(alloc)/1024/float64(n), "alloc-KB/op")
			b.ReportMetric(float64(bodyBytes)/1024/float64(n), "body-KB")
			b.ReportMetric(float64(reused)/float64(n), "reused-tokens")
		}
	}
	for _, turn := range []int{1, 2, 4, 8, 16} {
		for _, warm := range []bool{false, true} {
			name := "turn=" + strconv.Itoa(turn) + "/cold"
			if warm {
				name = "turn=" + strconv.Itoa(turn) + "/warm"
			}
			b.Run(name, func(b *testing.B) {
				measure(b, turn, func(salt string) string {
					if warm && turn > 1 {
						serveTurn(turn-1, salt)
					}
					return conv.body(turn, cfg.Model, salt)
				})
			})
		}
	}
	// played: a conversation as a client sends it (the OpenAI client's
	// field order, messages first): a system prompt, then each turn the
	// answers exactly as they were streamed back and a new question. The
	// turns before the timed one are played untimed under the turn's salt,
	// each answer generated until the end token (so the frontend keeps it,
	// Model.KeepAnswer); turn 1 is a new conversation, cold by definition.
	for _, turn := range []int{1, 2, 4, 8, 16} {
		b.Run("played/turn="+strconv.Itoa(turn), func(b *testing.B) {
			measure(b, turn, func(salt string) string {
				p := played{model: cfg.Model, salt: salt}
				for t := 1; t < turn; t++ {
					p.answers = append(p.answers, streamedText(b, srv, p.body(t, answerTokens)))
				}
				return p.body(turn, 1)
			})
		})
	}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// settle is the pause before a timed turn.
const settle = 5 * time.Millisecond

// answerTokens bounds a played answer; the simulated engine ends it with
// the end token long before (~700 tokens on average).
const answerTokens = 8000

// played is one conversation as a client plays it: the answers so far as
// they were streamed.
type played struct {
	model, salt string
	answers     []string
}

// playedSystem is the played conversations' system prompt (~330 tokens).
var playedSystem = strings.Repeat("You are a careful assistant for a logistics company. Answer in plain English, cite the figures you are given, and say so when you do not know. ", 11)

// body is the request of turn (1-based) with maxTokens.
func (p played) body(turn, maxTokens int) string {
	msgs := []map[string]string{{"role": "system", "content": playedSystem}}
	for t := 1; t <= turn; t++ {
		msgs = append(msgs, map[string]string{"role": "user", "content": question(t)})
		if t < turn {
			msgs = append(msgs, map[string]string{"role": "assistant", "content": p.answers[t-1]})
		}
	}
	// The field order of the OpenAI Python client: messages first, the
	// extra body (cache_salt) last.
	type req struct {
		Messages  []map[string]string `json:"messages"`
		Model     string              `json:"model"`
		MaxTokens int                 `json:"max_tokens"`
		Seed      int                 `json:"seed"`
		Stream    bool                `json:"stream"`
		CacheSalt string              `json:"cache_salt"`
	}
	js, err := json.Marshal(req{Messages: msgs, Model: p.model, MaxTokens: maxTokens, Seed: turn, Stream: true, CacheSalt: p.salt})
	if err != nil {
		panic(err)
	}
	return string(js)
}

// question is turn's user message (~640 o200k tokens).
func question(turn int) string {
	var sb strings.Builder
	for i := range 90 {
		sb.WriteString("question " + strconv.Itoa(turn*1000+i) + " is " + strconv.Itoa(i*7) + ", ")
	}
	return sb.String()
}

// streamedText serves body and returns the answer's text as a client
// reads it from the stream (the deltas' contents, in order); the answer
// must have ended with the end token (finish_reason stop).
func streamedText(b *testing.B, srv http.Handler, body string) string {
	w := httptest.NewRecorder()
	srv.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)))
	if w.Code != http.StatusOK {
		b.Fatalf("status %d: %.300s", w.Code, w.Body)
	}
	var text strings.Builder
	finish := ""
	for _, line := range strings.Split(w.Body.String(), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ev struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			b.Fatalf("event %q: %v", data, err)
		}
		for _, c := range ev.Choices {
			text.WriteString(c.Delta.Content)
			if c.FinishReason != nil {
				finish = *c.FinishReason
			}
		}
	}
	if finish != "stop" {
		b.Fatalf("a played answer ended with %q, not the end token", finish)
	}
	return text.String()
}

var timedLabel = pprof.Labels("turn", "timed")

// chatConversation is a conversation's messages as JSON, one user and one
// assistant message a turn.
type chatConversation struct{ turns []string }

func conversation(turns int) chatConversation {
	para := func(turn int, who string) string {
		var sb strings.Builder
		for i := range 90 {
			sb.WriteString(who + " " + strconv.Itoa(turn*1000+i) + " is " + strconv.Itoa(i*7) + ", ")
		}
		return sb.String()
	}
	var c chatConversation
	for t := range turns {
		c.turns = append(c.turns, `{"role":"user","content":"`+para(t, "question")+`"}`,
			`{"role":"assistant","content":"`+para(t, "answer")+`"}`)
	}
	return c
}

// body is turn's request (1-based): the history and the turn's question.
func (c chatConversation) body(turn int, model, salt string) string {
	return `{"model":"` + model + `","stream":true,"max_tokens":1,"cache_salt":"` + salt + `","messages":[` +
		strings.Join(c.turns[:2*turn-1], ",") + `]}`
}

// processCPU is the process's CPU time so far (every goroutine's: the
// frontend's, the worker's, the event relay's, the embedded NATS's, GC).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// heapAllocs is the bytes the process has allocated on the heap so far.
func heapAllocs() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// gcCPU is the CPU time the garbage collector has used so far, in ns
// (runtime/metrics' estimate).
func gcCPU() float64 {
	s := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}}
	metrics.Read(s)
	return s[0].Value.Float64() * 1e9
}

// stageSums are the summed seconds of each stage over some requests.
type stageSums map[string]float64

func readStages(b *testing.B, g prometheus.Gatherer) map[string]float64 {
	mfs, err := g.Gather()
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != stages.Metric {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "stage" {
					out[l.GetValue()] = m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return out
}

func (s *stageSums) add(after, before map[string]float64) {
	if *s == nil {
		*s = stageSums{}
	}
	for k, v := range after {
		(*s)[k] += v - before[k]
	}
}

// ownStages are kvmesh's own steps to a first token (first_token, from
// dispatch to the worker's first chunk, holds worker_admit and the engine).
var ownStages = []string{"read_body", "parse", "template", "tokenize", "hash", "route", "dispatch", "worker_admit", "first_write"}

func (s stageSums) report(b *testing.B, n int) {
	if n == 0 {
		return
	}
	us := func(k string) float64 { return s[k] / float64(n) * 1e6 }
	own := 0.0
	for _, k := range ownStages {
		own += us(k)
	}
	b.ReportMetric(own, "own-µs")
	b.ReportMetric(us("engine_first_output"), "engine-µs")
	for _, k := range ownStages {
		b.ReportMetric(us(k), k+"-µs")
	}
}
