package worker

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
)

// The decision alone, sample by sample.
func TestStallCheck(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	type sample struct {
		ms       int
		outputs  uint64
		inflight int64
		want     bool
	}
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		samples []sample
	}{
		{"output flows", 100 * time.Millisecond, []sample{
			{0, 0, 2, false}, {50, 1, 2, false}, {100, 2, 2, false}, {150, 3, 2, false}, {200, 4, 2, false}, {250, 5, 3, false}}},
		{"idle with nothing in flight", 100 * time.Millisecond, []sample{
			{0, 7, 0, false}, {100, 7, 0, false}, {200, 7, 0, false}, {1000, 7, 0, false}}},
		{"silent with streams in flight", 100 * time.Millisecond, []sample{
			{0, 3, 1, false}, {50, 3, 1, false}, {99, 3, 1, false}, {100, 3, 1, true}}},
		{"silence counts from the last output", 100 * time.Millisecond, []sample{
			{0, 3, 1, false}, {80, 4, 1, false}, {150, 4, 1, false}, {179, 4, 1, false}, {180, 4, 1, true}}},
		// A request arriving after a long idle spell gets the whole timeout,
		// counted from the first sample that sees it.
		{"idle then a request", 100 * time.Millisecond, []sample{
			{0, 5, 0, false}, {1000, 5, 0, false}, {1050, 5, 1, false}, {1100, 5, 1, false}, {1149, 5, 1, false}, {1150, 5, 1, true}}},
		// A sample with nothing in flight (the streams ended, or wait on
		// their callers) restarts the clock.
		{"a gap in flight restarts", 100 * time.Millisecond, []sample{
			{0, 5, 1, false}, {90, 5, 0, false}, {100, 5, 1, false}, {190, 5, 1, false}, {200, 5, 1, true}}},
		{"disabled", 0, []sample{{0, 1, 1, false}, {1000000, 1, 1, false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := stallCheck{timeout: tc.timeout}
			for _, s := range tc.samples {
				if got := c.observe(at(s.ms), s.outputs, s.inflight); got != s.want {
					t.Fatalf("at %d ms (outputs %d, in flight %d): stalled %v, want %v", s.ms, s.outputs, s.inflight, got, s.want)
				}
			}
		})
	}
}

// An engine that stops producing with a stream in flight takes the worker
// out of service: the stream and new calls fail with Unavailable, the
// discovery record goes, Health says not ok and the metrics count it. A
// busy worker, an idle one and one whose only caller does not read are
// left alone.
func TestWatchdogStall(t *testing.T) {
	_, nc := startNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d := memDiscovery(t, ctx, nc)
	wt, err := d.Watch(ctx, "m", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer wt.Close()
	reg := prometheus.NewRegistry()
	const timeout = 150 * time.Millisecond
	eng := &testEngine{tick: 10 * time.Millisecond}
	w, c := startWorkerWith(t, nc, eng, Config{StallTimeout: timeout, Registerer: reg})
	testutil.WaitFor(t, 10*time.Second, "worker discovered", func() bool { return len(wt.Instances()) == 1 })
	if g := testutil.Metrics(t, reg)[fmt.Sprintf(`kvmesh_worker_healthy{instance="%s",model="m"}`, natsbus.InstanceToken(w.InstanceID()))]; g != 1 {
		t.Fatalf("healthy %v at start", g)
	}
	probes := httptest.NewServer(w.HealthHandler())
	defer probes.Close()
	probeStatus(t, probes.URL+"/live", 200, "live")
	probeStatus(t, probes.URL+"/health", 200, "ready")

	// Busy for several timeouts: 60 tokens at 10 ms.
	st, err := c.Generate(ctx, &api.GenerateRequest{Tokens: prompt(1, 8), MaxTokens: 60})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		ch, err := st.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("busy stream after %d tokens: %v", n, err)
		}
		n += len(ch.Tokens)
	}
	if n != 60 {
		t.Fatalf("%d tokens, want 60", n)
	}
	time.Sleep(3 * timeout) // idle
	if w.Stalled() {
		t.Fatal("stalled while busy or idle")
	}
	// A caller that does not read: the stream waits on it, not on the
	// engine. Chunks of 200k tokens fill gRPC's flow-control window fast.
	eng.chunk.Store(200000)
	slow, err := c.Generate(ctx, &api.GenerateRequest{Tokens: prompt(2, 8), MaxTokens: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := slow.Recv(); err != nil {
		t.Fatal(err)
	}
	eng.chunk.Store(0)
	l := fmt.Sprintf(`{instance="%s",model="m"}`, natsbus.InstanceToken(w.InstanceID()))
	out := func() float64 { return testutil.Metrics(t, reg)["kvmesh_worker_output_tokens_total"+l] }
	for prev, deadline := -1.0, time.Now().Add(10*time.Second); ; { // until the output stops: Send blocks
		time.Sleep(2 * timeout)
		o := out()
		if o == prev {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("output never stopped behind a caller that does not read (%v tokens)", o)
		}
		prev = o
	}
	time.Sleep(2 * timeout)
	if w.Stalled() {
		t.Fatal("stalled while the only stream waits on its caller")
	}

	// Now the engine hangs mid-stream.
	st, err = c.Generate(ctx, &api.GenerateRequest{Tokens: prompt(3, 8), MaxTokens: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	eng.hang.Store(true)
	for {
		_, err = st.Recv()
		if err != nil {
			break
		}
	}
	// Timed from the engine's last output, not from when this reader saw
	// it: a reader scheduled late would otherwise see a short silence.
	took := time.Since(time.Unix(0, eng.lastOut.Load()))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("stalled stream ended with %v, want Unavailable", err)
	}
	// Sampled every timeout/4: noticed between timeout and 1.5 timeouts
	// after the last output, give or take the sampler's scheduling (it
	// dates a sample by its tick) and, above, a loaded machine.
	if took < timeout/2 || took > timeout+5*time.Second {
		t.Fatalf("stall noticed %v after the last token, timeout %v", took, timeout)
	}
	testutil.WaitFor(t, 10*time.Second, "stalled worker removed from discovery", func() bool { return len(wt.Instances()) == 0 })
	st, err = c.Generate(ctx, &api.GenerateRequest{Tokens: prompt(4, 8), MaxTokens: 2})
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("new call on a stalled worker: %v, want Unavailable", err)
	}
	if h, err := c.Health(ctx, &api.HealthRequest{}); err != nil || h.Ok {
		t.Fatalf("health of a stalled worker: %v %v", h, err)
	}
	// Kubernetes restarts it (liveness) and sends it nothing (readiness).
	probeStatus(t, probes.URL+"/live", 503, "engine stalled")
	probeStatus(t, probes.URL+"/health", 503, "engine stalled")
	got := testutil.Metrics(t, reg)
	if got["kvmesh_worker_engine_stalls_total"+l] != 1 || got["kvmesh_worker_healthy"+l] != 0 {
		t.Fatalf("stalls %v healthy %v", got["kvmesh_worker_engine_stalls_total"+l], got["kvmesh_worker_healthy"+l])
	}
	// The slow caller's stream is failed too once it reaches the engine again.
	for {
		if _, err := slow.Recv(); err != nil {
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("slow stream: %v", err)
			}
			break
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// An engine stuck inside Generate itself (on admission, before it returns
// a stream) still has its stream failed when the watchdog trips, and the
// stuck call is cleaned up once it returns.
func TestWatchdogStuckInGenerate(t *testing.T) {
	_, nc := startNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const timeout = 150 * time.Millisecond
	eng := &testEngine{tick: time.Millisecond, admit: make(chan struct{})}
	w, c := startWorkerWith(t, nc, eng, Config{StallTimeout: timeout})
	release := sync.OnceFunc(func() { close(eng.admit) })
	t.Cleanup(release) // before the worker's Close, should the test fail early
	st, err := c.Generate(ctx, &api.GenerateRequest{Tokens: prompt(1, 8), MaxTokens: 5})
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	_, err = st.Recv()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("stream stuck in Generate ended with %v, want Unavailable", err)
	}
	if took := time.Since(began); took > timeout+time.Second {
		t.Fatalf("stall noticed after %v, timeout %v", took, timeout)
	}
	if !w.Stalled() {
		t.Fatal("worker not marked stalled")
	}
	// The engine comes back: the abandoned call's stream is cancelled and
	// drained (goleak in TestMain checks nothing is left behind).
	release()
	testutil.WaitFor(t, 10*time.Second, "abandoned stream cancelled", func() bool { return eng.cancelled.Load() == 1 && eng.running.Load() == 0 })
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// A worker with several DP ranks reports every rank's last event id (and
// rank 0's in the old field); a single-rank one keeps the old format.
func TestLoadSampleLastEventIDs(t *testing.T) {
	for _, dp := range []int{1, 3} {
		w, err := New(Config{DPSize: dp}, &testEngine{tick: time.Millisecond}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, rank := range []uint32{0, 0, 2} {
			w.evlog.Append([]kv.Event{kv.Removed(kv.WorkerKey{DPRank: rank}, kv.TierDevice, []kv.EngineHash{1})}, nil)
		}
		r := w.loadSample()
		if len(r) != 1 || r[0].LastEventID != 2 {
			t.Fatalf("dp %d: %+v", dp, r)
		}
		if want := map[int][]uint64{1: nil, 3: {2, 0, 1}}[dp]; !reflect.DeepEqual(r[0].LastEventIDs, want) {
			t.Fatalf("dp %d: last event ids %v, want %v", dp, r[0].LastEventIDs, want)
		}
		w.Close()
	}
}

// probeStatus checks one probe's answer: its status and a word of its body.
func probeStatus(t *testing.T, url string, code int, says string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != code || !strings.Contains(string(b), says) {
		t.Fatalf("GET %s: %d %s, want %d with %q", url, resp.StatusCode, b, code, says)
	}
}

// A worker whose discovery record is not refreshed (NATS gone) is not
// ready once the TTL has passed, but still live: it comes back when NATS
// does.
func TestReadyFollowsRegistration(t *testing.T) {
	e, nc := startNATS(t)
	w, _ := startWorker(t, nc, &testEngine{})
	probes := httptest.NewServer(w.HealthHandler())
	defer probes.Close()
	probeStatus(t, probes.URL+"/health", 200, "ready")
	e.Shutdown()
	testutil.WaitFor(t, 10*time.Second, "not ready after the TTL", func() bool { return w.Ready() != nil })
	probeStatus(t, probes.URL+"/health", 503, "not refreshed")
	probeStatus(t, probes.URL+"/live", 200, "live")
	_ = w.Close()
	probeStatus(t, probes.URL+"/live", 503, "closed")
}
