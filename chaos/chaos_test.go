package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvmesh/kvmesh/bench"
	"github.com/kvmesh/kvmesh/eventplane"
)

// load is the fixed-rate open loop every phase runs: Poisson arrivals of
// shared-prefix chat requests (8 groups, 512-token system prompts), each
// asking for exactly outputLen tokens, through the failover client.
type load struct {
	rate      float64
	outputLen int
}

// phaseResult is one fault's accounting.
type phaseResult struct {
	Name  string  `json:"name"`
	Fault string  `json:"fault"`
	LoadS float64 `json:"load_s"`
	// Window is when the fault was in force, seconds from the load start.
	WindowS [2]float64 `json:"window_s"`

	Sent      int `json:"sent"`
	Completed int `json:"completed"` // full-length answers
	Short     int `json:"short"`     // answered 200 but fewer tokens than asked
	Migrated  int `json:"migrated"`  // streams moved to another worker (frontends' counter)
	Failed5xx int `json:"failed_5xx"`
	// Cut: streams that broke mid-way on a connection that died (a killed
	// frontend's in-flight streams); no balancer can replay them.
	Cut int `json:"cut"`
	// Lost: sent but never answered (timed out, or still open at the end).
	Lost  int            `json:"lost"`
	Other map[string]int `json:"other_errors,omitempty"`
	// FirstErrors is the first failed request's detail per kind.
	FirstErrors map[string]string `json:"first_errors,omitempty"`

	RateSent     float64 `json:"rate_sent"`
	RateDone     float64 `json:"rate_completed"`
	TTFTp50      float64 `json:"ttft_p50_ms"`       // whole phase
	TTFTp99      float64 `json:"ttft_p99_ms"`       // whole phase
	FaultTTFTp50 float64 `json:"fault_ttft_p50_ms"` // requests sent in the window
	FaultTTFTp99 float64 `json:"fault_ttft_p99_ms"`

	Diverged int    `json:"diverged_blocks"`
	Held     int    `json:"held_blocks"` // what the workers held when compared
	Why      string `json:"why,omitempty"`
	// Counters of the mechanism the fault exercises.
	Effects map[string]float64 `json:"effects,omitempty"`
}

// faultFn injects a fault at the start of the window and returns when it
// has been healed (the end of the window).
type faultFn func(ctx context.Context, fl *testFleet, effects *effects)

type effects struct {
	mu sync.Mutex
	m  map[string]float64
}

func (e *effects) add(k string, v float64) {
	e.mu.Lock()
	if e.m == nil {
		e.m = map[string]float64{}
	}
	e.m[k] += v
	e.mu.Unlock()
}

// runPhase runs the load for dur, injects fault at `at`, waits for both,
// lets the fleet settle and accounts every request.
func runPhase(t *testing.T, fl *testFleet, ld load, name, what string, dur, at time.Duration, fault faultFn) phaseResult {
	t.Helper()
	res := phaseResult{Name: name, Fault: what}
	counters := []string{"kvmesh_frontend_migrations_total",
		`kvmesh_kv_hint_results_total{result="fetched"}`, `kvmesh_kv_hint_results_total{result="partial"}`,
		`kvmesh_kv_hint_results_total{result="fallback"}`, `kvmesh_worker_engine_stalls_total`,
		"kvmesh_event_feed_gaps_total", "kvmesh_event_feed_repairs_total", "kvmesh_event_feed_duplicate_events_total"}
	before := map[string]float64{}
	for _, c := range counters {
		before[c] = fl.scr.sum(c)
	}
	out := t.TempDir()
	n := int(math.Ceil(ld.rate*dur.Seconds()*1.5)) + 16
	cfg := bench.LoadConfig{URL: "http://frontends/v1", Model: model,
		Synthetic: &bench.SyntheticConfig{Groups: 8, PromptsPerGroup: (n + 7) / 8, SystemLen: 512, QuestionLen: 48, OutputLen: ld.outputLen},
		Rate:      ld.rate, IgnoreEOS: true, Seed: uint64(len(name)) * 7919, Timeout: 30 * time.Second, Duration: dur, Grace: 40 * time.Second,
		OutDir: out, Client: &http.Client{Transport: fl.lb}}
	removals := fl.removals.Load()
	start := time.Now()
	var rep *bench.LoadReport
	var lerr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		rep, lerr = bench.RunLoad(context.Background(), cfg, io.Discard)
	}()
	var eff effects
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	select {
	case <-time.After(at):
	case <-done:
	}
	res.WindowS[0] = time.Since(start).Seconds()
	fault(ctx, fl, &eff)
	res.WindowS[1] = time.Since(start).Seconds()
	<-done
	if lerr != nil {
		t.Fatalf("%s: bench load: %v", name, lerr)
	}
	res.LoadS = rep.DurationS
	recs := readRecords(t, filepath.Join(out, bench.LoadRecordsFile))
	res.account(recs)
	res.Diverged, res.Held, res.Why = fl.settle(30 * time.Second)
	res.Migrated = int(fl.scr.sum(counters[0]) - before[counters[0]])
	res.Effects = eff.m
	if d := fl.removals.Load() - removals; d > 0 {
		eff.add("discovery_removals", float64(d))
		res.Effects = eff.m
	}
	for _, c := range counters[1:] {
		if d := fl.scr.sum(c) - before[c]; d > 0 {
			if res.Effects == nil {
				res.Effects = map[string]float64{}
			}
			res.Effects[strings.TrimPrefix(c, "kvmesh_")] = d
		}
	}
	t.Logf("%s: %s", name, res.line())
	return res
}

func readRecords(t *testing.T, path string) []bench.RequestRecord {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []bench.RequestRecord
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if l == "" {
			continue
		}
		var r bench.RequestRecord
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, r)
	}
	return out
}

func (res *phaseResult) account(recs []bench.RequestRecord) {
	var all, win []float64
	last := 0.0
	for _, r := range recs {
		res.Sent++
		if !r.OK {
			if res.FirstErrors == nil {
				res.FirstErrors = map[string]string{}
			}
			k := fmt.Sprintf("%s %d", r.Error, r.Status)
			if _, ok := res.FirstErrors[k]; !ok {
				res.FirstErrors[k] = r.Detail
			}
		}
		last = max(last, r.StartS)
		switch {
		case r.OK && r.OutputTokens == r.MaxTokens:
			res.Completed++
			all = append(all, r.TTFTms)
			// An instant fault's effect lasts a few seconds after it.
			if r.StartS >= res.WindowS[0] && r.StartS <= max(res.WindowS[1], res.WindowS[0]+5) {
				win = append(win, r.TTFTms)
			}
		case r.OK:
			res.Short++
		case r.Status >= 500:
			res.Failed5xx++
		case r.Error == bench.ErrTimeout || r.Error == bench.ErrCanceled:
			res.Lost++
		case r.Error == bench.ErrStream && strings.HasPrefix(r.Detail, "{"):
			res.Failed5xx++ // an error event in the stream: the server gave up on it
		case r.Error == bench.ErrStream || r.Error == bench.ErrConnection || r.Error == bench.ErrConnectionRefused:
			res.Cut++
		default:
			if res.Other == nil {
				res.Other = map[string]int{}
			}
			res.Other[r.Error]++
		}
	}
	if last > 0 {
		res.RateSent = float64(res.Sent) / last
		res.RateDone = float64(res.Completed) / last
	}
	res.TTFTp50, res.TTFTp99 = pct(all, 50), pct(all, 99)
	res.FaultTTFTp50, res.FaultTTFTp99 = pct(win, 50), pct(win, 99)
}

func pct(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	i := int(math.Ceil(p/100*float64(len(v)))) - 1
	return math.Round(v[max(i, 0)])
}

func (r phaseResult) line() string {
	return fmt.Sprintf("sent=%d completed=%d migrated=%d failed_5xx=%d cut=%d short=%d lost=%d other=%v rate=%.1f/s done=%.1f/s ttft p50/p99=%.0f/%.0f ms (in fault %.0f/%.0f ms, window %.1f–%.1f s) diverged=%d of %d effects=%v errors=%v %s",
		r.Sent, r.Completed, r.Migrated, r.Failed5xx, r.Cut, r.Short, r.Lost, r.Other, r.RateSent, r.RateDone, r.TTFTp50, r.TTFTp99,
		r.FaultTTFTp50, r.FaultTTFTp99, r.WindowS[0], r.WindowS[1], r.Diverged, r.Held, r.Effects, r.FirstErrors, r.Why)
}

// row is the phase as a docs/reliability.md table row.
func (r phaseResult) row() string {
	eff := make([]string, 0, len(r.Effects))
	for k, v := range r.Effects {
		eff = append(eff, fmt.Sprintf("%s %.0f", k, v))
	}
	slices.Sort(eff)
	return fmt.Sprintf("| %s | %.1f–%.1f s | %.1f | %d | %d | %d | %d | %d | %d | %.0f / %.0f | %.0f / %.0f | %d of %d | %s |",
		r.Name, r.WindowS[0], r.WindowS[1], r.RateSent, r.Sent, r.Completed, r.Migrated, r.Failed5xx, r.Cut, r.Lost,
		r.TTFTp50, r.TTFTp99, r.FaultTTFTp50, r.FaultTTFTp99, r.Diverged, r.Held, strings.Join(eff, ", "))
}

// check fails the test on what must never happen under any fault: a lost
// request, a short answer, a diverged index; and, unless the fault kills a
// frontend (whose open streams are cut), a failed or cut request.
func (r phaseResult) check(t *testing.T, cutsAllowed bool) {
	t.Helper()
	if r.Lost != 0 || r.Short != 0 || r.Diverged != 0 || len(r.Other) != 0 {
		t.Errorf("%s: lost %d, short %d, diverged %d (%s), other %v", r.Name, r.Lost, r.Short, r.Diverged, r.Why, r.Other)
	}
	if !cutsAllowed && (r.Failed5xx != 0 || r.Cut != 0) {
		t.Errorf("%s: %d failed with 5xx, %d cut", r.Name, r.Failed5xx, r.Cut)
	}
	if r.Completed+r.Failed5xx+r.Cut+r.Short+r.Lost+sum(r.Other) != r.Sent {
		t.Errorf("%s: accounting does not add up: %+v", r.Name, r)
	}
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// The faults. Each holds for `hold` (instant ones: the fleet runs without
// the victim that long, then a replacement starts).

func killWorker(hold time.Duration) faultFn {
	return func(ctx context.Context, fl *testFleet, e *effects) {
		w := fl.busyWorker(5 * time.Second)
		if w == nil {
			fl.t.Error("kill worker: no worker had a stream in flight")
			return
		}
		w.dead.Store(true)
		w.Kill()
		e.add("workers_killed", 1)
		sleep(ctx, hold)
		fl.startWorker()
	}
}

func stopWorker(hold time.Duration) faultFn {
	return func(ctx context.Context, fl *testFleet, e *effects) {
		w := fl.busyWorker(5 * time.Second)
		if w == nil {
			fl.t.Error("stop worker: no worker had a stream in flight")
			return
		}
		if err := w.Signal(syscall.SIGSTOP); err != nil {
			fl.t.Error(err)
			return
		}
		e.add("workers_stopped", 1)
		sleep(ctx, hold)
		if err := w.Signal(syscall.SIGCONT); err != nil {
			fl.t.Error(err)
		}
	}
}

// stallEngine adds a worker whose engine is its own process (the vLLM
// adapter in front of mock-engine vllm), waits for it to carry streams,
// freezes the engine for hold — the worker process lives on, so its stall
// watchdog must fail the streams (they migrate) and take it out of
// discovery — then resumes the engine and retires the worker, as its
// supervisor would restart it.
func stallEngine(hold time.Duration) faultFn {
	return func(ctx context.Context, fl *testFleet, e *effects) {
		ew := fl.startEngineWorker()
		deadline := time.Now().Add(10 * time.Second)
		for fl.running()[ew.id] == 0 {
			if time.Now().After(deadline) {
				fl.t.Error("stall engine: the engine worker never carried a stream")
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err := ew.engine.Signal(syscall.SIGSTOP); err != nil {
			fl.t.Error(err)
			return
		}
		e.add("engines_stopped", 1)
		sleep(ctx, hold)
		if err := ew.engine.Signal(syscall.SIGCONT); err != nil {
			fl.t.Error(err)
		}
		ew.dead.Store(true)
		ew.Kill()
		ew.engine.Kill()
	}
}

func restartNATS(down time.Duration) faultFn {
	return func(ctx context.Context, fl *testFleet, e *effects) {
		e.add("nats_restarts", 1)
		fl.restartNATS(down)
	}
}

// dropEvents has the NATS proxy swallow one event batch every `every`.
func dropEvents(hold, every time.Duration) faultFn {
	return func(ctx context.Context, fl *testFleet, e *effects) {
		before := fl.proxy.dropped.Load()
		end := time.Now().Add(hold)
		for time.Now().Before(end) && ctx.Err() == nil {
			fl.proxy.drop.Store(1)
			sleep(ctx, every)
		}
		fl.proxy.drop.Store(0)
		e.add("event_batches_dropped", float64(fl.proxy.dropped.Load()-before))
	}
}

// duplicateEvents republishes every event batch seen on the bus once more,
// from the test's own connection (which does not hear its own copies).
func duplicateEvents(hold time.Duration) faultFn {
	return func(ctx context.Context, fl *testFleet, e *effects) {
		nc, err := nats.Connect(fl.natsURL(), append(fl.admin.Options(), nats.NoEcho(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true))...)
		if err != nil {
			fl.t.Error(err)
			return
		}
		defer nc.Close()
		var n float64
		var mu sync.Mutex
		sub, err := nc.Subscribe(eventplane.EventSubjectAll(model), func(m *nats.Msg) {
			if nc.PublishMsg(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data}) == nil {
				mu.Lock()
				n++
				mu.Unlock()
			}
		})
		if err != nil {
			fl.t.Error(err)
			return
		}
		sleep(ctx, hold)
		sub.Unsubscribe()
		nc.Flush()
		mu.Lock()
		e.add("event_batches_duplicated", n)
		mu.Unlock()
	}
}

func peerFault(mode int32, hold time.Duration) faultFn {
	return func(ctx context.Context, fl *testFleet, e *effects) {
		ws := fl.liveWorkers()
		var c0, s0 int64
		for _, w := range ws {
			c0 += w.peer.corrupted.Load()
			s0 += w.peer.stalled.Load()
			w.peer.mode.Store(mode)
		}
		sleep(ctx, hold)
		var c1, s1 int64
		for _, w := range ws {
			w.peer.mode.Store(peerPass)
			c1 += w.peer.corrupted.Load()
			s1 += w.peer.stalled.Load()
		}
		if mode == peerCorrupt {
			e.add("transfer_chunks_corrupted", float64(c1-c0))
		} else {
			e.add("transfers_stalled", float64(s1-s0))
		}
	}
}

func killFrontend(hold time.Duration) faultFn {
	return func(ctx context.Context, fl *testFleet, e *effects) {
		fs := fl.liveFrontends()
		if len(fs) < 2 {
			fl.t.Error("kill frontend: needs two replicas")
			return
		}
		tries := fl.lb.tries.Load()
		fs[0].dead.Store(true)
		fs[0].Kill()
		e.add("frontends_killed", 1)
		sleep(ctx, hold)
		fl.startFrontend() // syncLB drops the dead one from rotation
		fl.waitReady(30 * time.Second)
		e.add("lb_failovers", float64(fl.lb.tries.Load()-tries))
	}
}

// together runs faults at once, each started `stagger` after the previous.
func together(stagger time.Duration, faults ...faultFn) faultFn {
	return func(ctx context.Context, fl *testFleet, e *effects) {
		var wg sync.WaitGroup
		for i, f := range faults {
			wg.Go(func() {
				sleep(ctx, time.Duration(i)*stagger)
				f(ctx, fl, e)
			})
		}
		wg.Wait()
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// TestChaosShort is the default run's variant: a worker SIGKILLed
// mid-stream and every event batch duplicated for a few seconds, under a
// steady load; nothing is lost and the index matches the workers.
func TestChaosShort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	fl := startFleet(t, fleetConfig{Workers: 2, Frontends: 1, StallTimeout: 2 * time.Second, DiscoveryTTL: 2 * time.Second})
	r := runPhase(t, fl, load{rate: 6, outputLen: 96}, "kill+duplicate", "SIGKILL of a busy worker and every event batch duplicated",
		5*time.Second, 1500*time.Millisecond, together(0, killWorker(2*time.Second), duplicateEvents(3*time.Second)))
	r.check(t, false)
	if r.Migrated == 0 {
		t.Errorf("no stream migrated off the killed worker: %s", r.line())
	}
	if r.Held == 0 {
		t.Errorf("the workers held no blocks: the index comparison proved nothing")
	}
	if r.Effects["event_batches_duplicated"] == 0 {
		t.Errorf("no event batch was duplicated: %s", r.line())
	}
}

// TestChaos is the long run (KVMESH_CHAOS=1): three workers and two
// frontend replicas under a fixed-rate load; each fault held for tens of
// seconds, one at a time, then all together. KVMESH_CHAOS_OUT=path writes
// the results as JSON.
func TestChaos(t *testing.T) {
	if os.Getenv("KVMESH_CHAOS") != "1" {
		t.Skip("long chaos run: set KVMESH_CHAOS=1")
	}
	hold := envDuration("KVMESH_CHAOS_HOLD", 20*time.Second)
	stall := 2 * time.Second
	fl := startFleet(t, fleetConfig{Workers: 3, Frontends: 2, StallTimeout: stall, DiscoveryTTL: 2 * time.Second})
	ld := load{rate: 8, outputLen: 128}
	phase := hold + 15*time.Second
	at := 5 * time.Second
	type ph struct {
		name, what string
		cuts       bool
		f          faultFn
	}
	phases := []ph{
		{"baseline", "no fault", false, func(context.Context, *testFleet, *effects) {}},
		{"worker SIGKILL", "a worker with streams in flight is SIGKILLed; a replacement starts after the hold", false, killWorker(hold)},
		{"worker SIGSTOP", fmt.Sprintf("a busy worker is frozen for the hold (stall timeout %v, discovery TTL 2s), then SIGCONT", stall), false, stopWorker(hold)},
		{"engine SIGSTOP", fmt.Sprintf("a fourth worker's engine process (vLLM adapter → mock-engine vllm) is frozen for the hold while the worker lives (stall timeout %v)", stall), false, stallEngine(hold)},
		{"NATS restart", "the NATS server is stopped for 10 s and restarted on the same port and JetStream directory", false, restartNATS(10 * time.Second)},
		{"event batch dropped", "one KV event batch a second is swallowed between a worker and NATS", false, dropEvents(hold, time.Second)},
		{"event batch duplicated", "every KV event batch is published twice", false, duplicateEvents(hold)},
		{"peer corrupts", "every peer transfer chunk has a byte flipped on the wire", false, peerFault(peerCorrupt, hold)},
		{"peer stalls", "every peer transfer stops half-way and the connection hangs", false, peerFault(peerStall, hold)},
		{"frontend SIGKILL", "one of two frontend replicas is SIGKILLed; the balancer fails over; a replacement starts after the hold", true, killFrontend(hold)},
		{"all together", "all of the above but the stall, 2 s apart, NATS last", true, together(2*time.Second,
			killWorker(hold), stopWorker(hold), dropEvents(hold, time.Second), duplicateEvents(hold),
			peerFault(peerCorrupt, hold), killFrontend(hold), restartNATS(10*time.Second))},
	}
	var results []phaseResult
	only := regexp.MustCompile(os.Getenv("KVMESH_CHAOS_ONLY"))
	for _, p := range phases {
		if !only.MatchString(p.name) {
			continue
		}
		r := runPhase(t, fl, ld, p.name, p.what, phase, at, p.f)
		r.check(t, p.cuts)
		results = append(results, r)
		fl.waitReady(30 * time.Second)
	}
	var b strings.Builder
	b.WriteString("| fault | window | rate/s | sent | completed | migrated | 5xx | cut | lost | TTFT p50/p99 ms | in fault p50/p99 ms | diverged | exercised |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		b.WriteString(r.row() + "\n")
	}
	t.Logf("results:\n%s", b.String())
	if p := os.Getenv("KVMESH_CHAOS_OUT"); p != "" {
		j, _ := json.MarshalIndent(results, "", "  ")
		if err := os.WriteFile(p, j, 0o644); err != nil {
			t.Error(err)
		}
	}
}

func envDuration(name string, def time.Duration) time.Duration {
	if v := os.Getenv(name); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
	}
	return def
}
