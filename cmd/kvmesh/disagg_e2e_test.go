package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/natsbus"
)

// legLog is what the workers' debug logs say about one request's legs.
type legLog struct {
	prefill, decode []map[string]string // "disagg leg" lines
	answers         []string            // "disagg prefill answered" params digests
}

// legLogs collects the legs of every request from processes' stderr.
func legLogs(stderr ...string) map[string]*legLog {
	out := map[string]*legLog{}
	get := func(id string) *legLog {
		if out[id] == nil {
			out[id] = &legLog{}
		}
		return out[id]
	}
	for _, s := range stderr {
		for _, line := range strings.Split(s, "\n") {
			f := testutil.Fields(line)
			switch {
			case strings.Contains(line, `msg="disagg leg"`):
				l := get(f["request"])
				if f["leg"] == "prefill" {
					l.prefill = append(l.prefill, f)
				} else {
					l.decode = append(l.decode, f)
				}
			case strings.Contains(line, `msg="disagg prefill answered"`):
				l := get(f["request"])
				l.answers = append(l.answers, f["params"])
			}
		}
	}
	return out
}

// checkLegs asserts the apply-once rule on the worker side for request id:
// one prefill leg that answered with parameters, one decode leg that got
// exactly those parameters and no hint. It reports whether the prefill leg
// carried a hint.
func checkLegs(t *testing.T, logs map[string]*legLog, id string) bool {
	t.Helper()
	l := logs[id]
	if l == nil || len(l.prefill) != 1 || len(l.decode) != 1 || len(l.answers) != 1 {
		t.Fatalf("request %s: legs %+v", id, l)
	}
	d := l.decode[0]
	if d["hint"] != "false" {
		t.Errorf("request %s: the decode leg applied a hint: %v", id, d)
	}
	if d["params"] == "" || d["params"] != l.answers[0] || d["params_stripped"] != "false" {
		t.Errorf("request %s: decode leg's kv_transfer_params %q, the prefill answered %q", id, d["params"], l.answers[0])
	}
	return l.prefill[0]["hint"] == "true"
}

func chatNew(ctx context.Context, c openai.Client, p openai.ChatCompletionNewParams) (*openai.ChatCompletion, error) {
	return c.Chat.Completions.New(ctx, p)
}

// TestServeDisaggregated: `kvmesh serve --prefill-workers 2 --decode-workers
// 2`, driven with openai-go, streaming and not. Conditional disaggregation's
// length rule is off, so every request takes both legs. The workers' logs
// show each prefill leg answered with connector parameters and each decode
// leg got exactly those and never a hint; with a random router pick, a
// follow-up turn eventually lands on the prefill worker that lacks the
// prefix and its prefill leg carries the hint.
func TestServeDisaggregated(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvmesh processes")
	}
	p := startProc(t, "kvmesh serve", "serve", "--listen", "127.0.0.1:0", "--log-level", "debug",
		"--prefill-workers", "2", "--decode-workers", "2", "--disagg-local-prefill-tokens", "0",
		"--router-temperature", "20", "--speedup-ratio", "20")
	base := p.Expect(serveLine, 30*time.Second)[1]
	client := newClient(base)
	ctx := context.Background()
	long := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 120)

	// Non-streaming and streaming answers agree, with usage.
	one, err := chatNew(ctx, client, chatParams(long, 5, 12))
	if err != nil {
		t.Fatal(err)
	}
	st, err := streamChat(ctx, client, chatParams(long, 5, 12))
	if err != nil {
		t.Fatal(err)
	}
	if one.Choices[0].Message.Content != st.text || one.Choices[0].FinishReason != "length" || st.finish != "length" ||
		one.Usage.CompletionTokens != 12 || st.usage == nil || st.usage.PromptTokens != one.Usage.PromptTokens {
		t.Fatalf("non-streaming %q %+v, streaming %q %+v", one.Choices[0].Message.Content, one.Usage, st.text, st.usage)
	}
	// max_tokens 1: the prefill's token is the answer.
	if r, err := chatNew(ctx, client, chatParams(long+" once", 5, 1)); err != nil || r.Usage.CompletionTokens != 1 {
		t.Fatalf("max_tokens 1: %+v %v", r, err)
	}

	// Turns sharing the prompt's prefix until a prefill leg is hinted (a
	// random pick sends one to the prefill worker lacking the prefix).
	ids := []string{one.ID, st.id}
	hinted := false
	waitLegs := func(id string) {
		testutil.WaitFor(t, 15*time.Second, "request "+id+"'s legs in the logs", func() bool {
			l := legLogs(p.Stderr())[id]
			return l != nil && len(l.decode) == 1 && len(l.answers) == 1
		})
	}
	for _, id := range ids {
		waitLegs(id)
		hinted = checkLegs(t, legLogs(p.Stderr()), id) || hinted
	}
	// A fresh prefix: its first request computes it on one prefill worker;
	// once the router's index has that worker's events, a turn the random
	// pick sends to the other prefill worker is hinted. (Sent too soon, the
	// other worker would compute the prefix too, and no hint would follow.)
	prefix := strings.Repeat("A second conversation about hints. ", 120)
	for i := 0; i < 12 && !hinted; i++ {
		time.Sleep(300 * time.Millisecond) // the index learns the last turn's blocks
		r, err := chatNew(ctx, client, chatParams(prefix+fmt.Sprintf(" Turn %d: %s", i, strings.Repeat("more words here ", 200)), 6, 4))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.ID)
		waitLegs(r.ID)
		hinted = checkLegs(t, legLogs(p.Stderr()), r.ID)
	}
	if !hinted {
		t.Errorf("no prefill leg carried a hint in %d requests", len(ids))
	}
	m := testutil.Scrape(t, strings.TrimSuffix(base, "/v1")+"/metrics")
	if v := m[`kvmesh_fleet_requests_by_path_total{path="disagg",reason=""}`]; v != float64(1+len(ids)) {
		t.Errorf("disagg requests %v", v)
	}
	sum := func(m map[string]float64, prefix string) (n float64) {
		for k, v := range m {
			if strings.HasPrefix(k, prefix) {
				n += v
			}
		}
		return n
	}
	if pulled := sum(m, "kvmesh_disagg_handoff_bytes_total{"); pulled == 0 {
		t.Errorf("no handoff bytes pulled")
	}
	// The first prompt again until a decode leg lands on a decode worker
	// that holds it already: it pulls nothing and sends a release message.
	released := func() float64 {
		return sum(testutil.Scrape(t, strings.TrimSuffix(base, "/v1")+"/metrics"), `kvmesh_disagg_handoffs_released_total{by="release"`)
	}
	for i := 0; i < 20 && released() == 0; i++ {
		if _, err := chatNew(ctx, client, chatParams(long, 5, 4)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond) // the release goes after the pull step, on its own
	}
	// Every pin goes at once, long before the default 30 s TTL: a decode
	// worker that read the prompt's last block released it by the read,
	// one that held it already (or failed its pull) by a release message.
	pinned := func() float64 {
		return sum(testutil.Scrape(t, strings.TrimSuffix(base, "/v1")+"/metrics"), "kvmesh_disagg_pinned_blocks{")
	}
	testutil.WaitFor(t, 10*time.Second, "every handoff pin released (read or release message)", func() bool { return pinned() == 0 },
		func() string { return fmt.Sprintf("%v blocks pinned", pinned()) })
	m = testutil.Scrape(t, strings.TrimSuffix(base, "/v1")+"/metrics")
	read, rel := sum(m, `kvmesh_disagg_handoffs_released_total{by="read"`), sum(m, `kvmesh_disagg_handoffs_released_total{by="release"`)
	if handoffs := sum(m, "kvmesh_disagg_prefill_handoffs_total{"); read+rel != handoffs || rel == 0 ||
		sum(m, "kvmesh_disagg_handoffs_expired_total{") != 0 || sum(m, "kvmesh_disagg_release_failures_total{") != 0 {
		t.Errorf("%v handoffs: %v released by a read, %v by a release message, %v expired, %v release failures", handoffs, read, rel,
			sum(m, "kvmesh_disagg_handoffs_expired_total{"), sum(m, "kvmesh_disagg_release_failures_total{"))
	}
}

// TestWorkerRolesJoinFleet: separate processes over external NATS. With a
// prefill worker alone the frontend is unhealthy and answers 503, both with
// the reason; once a decode worker joins, requests are served disaggregated.
func TestWorkerRolesJoinFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvmesh processes")
	}
	ns, err := natsbus.StartEmbedded(natsbus.EmbeddedConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	pre := startProc(t, "kvmesh worker (prefill)", "worker", "--nats", ns.URL(), "--role", "prefill", "--control-listen", "127.0.0.1:0",
		"--advertise-host", "127.0.0.1", "--speedup-ratio", "20", "--log-level", "debug")
	pre.Expect(workerLine, 20*time.Second)
	fe := startProc(t, "kvmesh frontend", "frontend", "--nats", ns.URL(), "--listen", "127.0.0.1:0", "--log-level", "warn")
	base := fe.Expect(frontendLine, 20*time.Second)[1]
	health := strings.TrimSuffix(base, "/v1") + "/health"
	var body string
	testutil.WaitFor(t, 10*time.Second, "health names the missing decode pool", func() bool {
		resp, err := http.Get(health)
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		return resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(body, "prefill workers but no decode workers")
	})
	client := newClient(base)
	ctx := context.Background()
	_, err = chatNew(ctx, client, chatParams("hello", 1, 4))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusServiceUnavailable || !strings.Contains(apiErr.Message, "no decode workers") {
		t.Fatalf("request without a decode pool: %v", err)
	}

	dec := startProc(t, "kvmesh worker (decode)", "worker", "--nats", ns.URL(), "--role", "decode", "--speedup-ratio", "20", "--log-level", "debug")
	dec.Expect(workerLine, 20*time.Second)
	testutil.WaitFor(t, 10*time.Second, "frontend /health", func() bool {
		resp, err := http.Get(health)
		if err != nil {
			return false
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	long := strings.Repeat("Disaggregated serving across processes. ", 150)
	one, err := chatNew(ctx, client, chatParams(long, 3, 10))
	if err != nil {
		t.Fatal(err)
	}
	st, err := streamChat(ctx, client, chatParams(long, 3, 10))
	if err != nil {
		t.Fatal(err)
	}
	if one.Choices[0].Message.Content != st.text || st.usage == nil || st.usage.CompletionTokens != 10 {
		t.Fatalf("non-streaming %q, streaming %q %+v", one.Choices[0].Message.Content, st.text, st.usage)
	}
	// The first was disaggregated; the second, the same prompt again, found
	// it on the decode worker and prefilled there (conditional
	// disaggregation's length rule).
	testutil.WaitFor(t, 15*time.Second, "the first request's legs in the worker logs", func() bool {
		l := legLogs(pre.Stderr(), dec.Stderr())[one.ID]
		return l != nil && len(l.decode) == 1 && len(l.answers) == 1
	})
	logs := legLogs(pre.Stderr(), dec.Stderr())
	checkLegs(t, logs, one.ID)
	if l := logs[st.id]; l != nil {
		t.Errorf("the repeated prompt took legs %+v; want a local prefill", l)
	}
	m := testutil.Scrape(t, strings.TrimSuffix(base, "/v1")+"/metrics")
	if m[`kvmesh_fleet_requests_by_path_total{path="disagg",reason=""}`] != 1 ||
		m[`kvmesh_fleet_requests_by_path_total{path="local_prefill",reason="isl"}`] != 1 {
		t.Errorf("paths: disagg %v, local_prefill/isl %v", m[`kvmesh_fleet_requests_by_path_total{path="disagg",reason=""}`],
			m[`kvmesh_fleet_requests_by_path_total{path="local_prefill",reason="isl"}`])
	}
	if st.usage.PromptTokensDetails.CachedTokens == 0 {
		t.Errorf("the local prefill reports no cached tokens: %+v", st.usage)
	}
	if !strings.Contains(dec.Stderr(), `msg="disagg handoff pull"`) || strings.Contains(dec.Stderr(), "inserted=0") {
		t.Errorf("the decode worker did not pull the prompt's blocks:\n%s", dec.Stderr())
	}
}
