package fleet

// End-to-end tests of the Cluster against real `kvmesh worker` processes
// (simulated engine) and an embedded NATS server, all on loopback. Each
// subtest has its own NATS server, data dir and workers, and checks for
// leaked goroutines after everything it started has stopped.
//
// KVMESH_TEST_BIN names a prebuilt kvmesh binary to use instead of building
// ./cmd/kvmesh (handy when iterating on these tests).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/index/ref"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/workerclient"
)

const (
	e2eModel     = "m"
	e2eTTL       = 2 * time.Second
	e2eBlockSize = 64
)

func TestClusterE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kvmesh and runs worker processes")
	}
	bin := testutil.Binary(t)
	t.Run("PrefixAffinity", func(t *testing.T) { testPrefixAffinity(t, bin) })
	t.Run("KilledWorkerLeavesRouting", func(t *testing.T) { testKilledWorker(t, bin) })
	t.Run("NATSRestart", func(t *testing.T) { testNATSRestart(t, bin) })
	t.Run("EventGapRepair", func(t *testing.T) { testEventGap(t, bin) })
	t.Run("ReplicaSync", func(t *testing.T) { testReplicaSync(t, bin) })
	t.Run("BadInput", func(t *testing.T) { testBadInput(t, bin) })
}

// e2e is one subtest's cluster: NATS, the test's own connection and
// discovery handle, worker processes and a log of the in-process side.
type e2e struct {
	t    *testing.T
	bin  string
	ctx  context.Context
	dir  string
	srv  *natsbus.Embedded
	port int
	url  string
	nc   *nats.Conn
	disc *discovery.Discovery
	logs *logSink
	log  *slog.Logger
	// clients dials workers directly (dumps, direct generates).
	clients *workerclient.Pool
	workers map[uint64]*e2eWorker
}

type e2eWorker struct {
	proc *testutil.Proc
	in   discovery.Instance // ID and GRPCAddr, from the ready line
}

func (w *e2eWorker) key() kv.WorkerKey { return kv.WorkerKey{Instance: w.in.ID} }

func newE2E(t *testing.T, bin string) *e2e {
	t.Helper()
	ignore := []goleak.Option{goleak.IgnoreCurrent(),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*ats).start")}
	t.Cleanup(func() { goleak.VerifyNone(t, ignore...) }) // first registered: runs last
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	e := &e2e{t: t, bin: bin, ctx: ctx, dir: t.TempDir(), logs: &logSink{}, workers: map[uint64]*e2eWorker{}}
	e.log = slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("in-process log:\n%s", e.logs.String())
		}
	})
	srv, err := natsbus.StartEmbedded(natsbus.EmbeddedConfig{DataDir: e.dir})
	if err != nil {
		t.Fatal(err)
	}
	e.srv, e.port, e.url = srv, srv.Port(), srv.URL()
	t.Cleanup(func() { e.srv.Shutdown() })
	e.nc = e.connect(e.url)
	// The test creates the bucket, so its short TTL is the bucket's.
	e.disc = e.openDiscovery(e.nc)
	if got := e.disc.TTL(); got != e2eTTL {
		t.Fatalf("bucket TTL %v, want %v", got, e2eTTL)
	}
	e.clients = workerclient.NewPool()
	t.Cleanup(e.clients.Close)
	return e
}

func (e *e2e) connect(url string) *nats.Conn {
	e.t.Helper()
	nc, err := natsbus.Connect(natsbus.ConnConfig{URLs: url, Name: "e2e", ReconnectWait: 50 * time.Millisecond,
		MaxReconnectWait: 200 * time.Millisecond, Logger: e.log})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(nc.Close)
	return nc
}

func (e *e2e) openDiscovery(nc *nats.Conn) *discovery.Discovery {
	e.t.Helper()
	d, err := discovery.Open(e.ctx, nc, discovery.Config{TTL: e2eTTL, Logger: e.log})
	if err != nil {
		e.t.Fatal(err)
	}
	return d
}

// startWorker runs `kvmesh worker --engine sim` and waits for its ready
// line. The sim runs in real time (prefill of 2k tokens ≈ 50 ms, a decode
// step ≈ 6 ms) unless extra flags say otherwise.
func (e *e2e) startWorker(extra ...string) *e2eWorker {
	e.t.Helper()
	args := append([]string{"worker", "--engine", "sim", "--nats", e.url, "--model", e2eModel,
		"--discovery-ttl", e2eTTL.String(), "--load-interval", "100ms", "--log-level", "warn",
		"--block-size", strconv.Itoa(e2eBlockSize), "--blocks", "4096", "--speedup-ratio", "1"}, extra...)
	p := testutil.Start(e.t, "kvmesh worker", e.bin, nil, args...)
	line, err := p.WaitLine("kvmesh worker ready", 30*time.Second)
	if err != nil {
		e.t.Fatal(err)
	}
	f := testutil.Fields(line)
	id, err := strconv.ParseUint(f["instance"], 16, 64)
	if err != nil || f["grpc"] == "" {
		e.t.Fatalf("ready line %q", line)
	}
	w := &e2eWorker{proc: p, in: discovery.Instance{ID: id, Model: e2eModel, GRPCAddr: f["grpc"]}}
	e.workers[id] = w
	return w
}

func (e *e2e) startWorkers(n int, extra ...string) []*e2eWorker {
	out := make([]*e2eWorker, n)
	for i := range out {
		out[i] = e.startWorker(extra...)
	}
	return out
}

type clusterOpts struct {
	nc          *nats.Conn
	disc        *discovery.Discovery
	replicaSync bool
	reg         *prometheus.Registry
}

// newCluster starts a Cluster in kv mode. A short InhibitFor makes sure
// that what keeps a dead worker out of routing in these tests is discovery,
// not the failure inhibit.
func (e *e2e) newCluster(o clusterOpts) *Cluster {
	e.t.Helper()
	if o.nc == nil {
		o.nc, o.disc = e.nc, e.disc
	}
	if o.reg == nil {
		o.reg = prometheus.NewRegistry()
	}
	c, err := New(e.ctx, Config{NC: o.nc, Discovery: o.disc, Models: []string{e2eModel},
		Router: router.Config{Mode: router.ModeKV, InhibitFor: 200 * time.Millisecond}, ReplicaSync: o.replicaSync,
		Registerer: o.reg, Logger: e.log})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(c.Close)
	return c
}

// waitSynced waits until the cluster routes to exactly these workers and
// its feed has dumped each of them.
func (e *e2e) waitSynced(c *Cluster, ws ...*e2eWorker) {
	e.t.Helper()
	want := map[kv.WorkerKey]bool{}
	for _, w := range ws {
		want[w.key()] = true
	}
	waitFor(e.t, 10*time.Second, fmt.Sprintf("cluster routing to %d workers", len(ws)), func() bool {
		got := c.router.Workers(e2eModel, kv.RoleAggregated)
		if len(got) != len(want) {
			return false
		}
		for _, wi := range got {
			if !want[wi.Key] {
				return false
			}
			if _, ok := c.feeds[e2eModel].LastID(wi.Key); !ok {
				return false
			}
		}
		return true
	})
}

// indexMatchesWorker reports whether the cluster's index holds exactly what
// the worker's engine holds (its Dump over gRPC), at the same event id.
func (e *e2e) indexMatchesWorker(c *Cluster, w *e2eWorker) (bool, string) {
	cl, err := e.clients.Get(w.in)
	if err != nil {
		return false, err.Error()
	}
	dr, err := cl.Dump(e.ctx, &api.DumpRequest{Worker: api.KeyToProto(w.key())})
	if err != nil {
		return false, err.Error()
	}
	last, ok := c.feeds[e2eModel].LastID(w.key())
	if !ok || last != dr.LastId {
		return false, fmt.Sprintf("feed at event %d (known %v), worker at %d", last, ok, dr.LastId)
	}
	evs, err := api.EventsFromProto(dr.Events)
	if err != nil {
		e.t.Fatal(err)
	}
	own := holdings(w.key(), evs)
	got := holdings(w.key(), c.index.Dump(w.key()))
	if len(got) != len(own) || (len(own) > 0 && !reflect.DeepEqual(got, own)) {
		return false, fmt.Sprintf("cluster index holds %d blocks, worker %d", len(got), len(own))
	}
	return true, ""
}

func (e *e2e) waitIndexMatches(c *Cluster, ws ...*e2eWorker) {
	e.t.Helper()
	for _, w := range ws {
		var why string
		waitFor(e.t, 15*time.Second, "cluster index equal to worker's own", func() bool {
			ok, reason := e.indexMatchesWorker(c, w)
			why = reason
			return ok
		}, func() string { return why })
	}
}

// generateDirect runs a request on a worker without the router (the
// worker's cache and events change; the router books nothing).
func (e *e2e) generateDirect(w *e2eWorker, toks []uint32) {
	e.t.Helper()
	cl, err := e.clients.Get(w.in)
	if err != nil {
		e.t.Fatal(err)
	}
	st, err := cl.Generate(e.ctx, &api.GenerateRequest{Tokens: toks, MaxTokens: 2})
	if err != nil {
		e.t.Fatal(err)
	}
	for {
		if _, err := st.Recv(); err == io.EOF {
			return
		} else if err != nil {
			e.t.Fatal(err)
		}
	}
}

func holdings(w kv.WorkerKey, evs []kv.Event) []ref.Holding {
	ix := ref.New()
	for _, e := range evs {
		e.Worker = w
		ix.Apply(e)
	}
	return ix.Holdings(w)
}

// genResult is one request's outcome through the cluster.
type genResult struct {
	worker kv.WorkerKey
	cached int
	prompt int
	tokens int
}

// asWorkerStream is the worker stream under a whole-request stream.
func asWorkerStream(st kv.TokenStream) *workerStream {
	if p, ok := st.(polledStream); ok {
		return p.workerStream
	}
	return st.(*workerStream)
}

// generate sends a request through the cluster and reads it to the end.
func generate(ctx context.Context, c *Cluster, model string, toks []uint32, maxTokens int) (genResult, error) {
	st, err := c.Generate(ctx, &kv.GenerateRequest{Model: model, Tokens: toks, Sampling: kv.Sampling{MaxTokens: maxTokens}})
	if err != nil {
		return genResult{}, err
	}
	defer st.Close()
	res := genResult{worker: asWorkerStream(st).d.Worker}
	for {
		ch, err := st.Recv()
		if err != nil {
			return res, err
		}
		res.tokens += len(ch.Tokens)
		if ch.Finish != "" {
			res.cached, res.prompt = ch.CachedTokens, ch.PromptTokens
			return res, nil
		}
	}
}

// prompt is n pseudo-random token ids from seed.
func prompt(seed uint64, n int) []uint32 {
	r := rand.New(rand.NewPCG(seed, 0x6b766d657368))
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(r.IntN(150000))
	}
	return out
}

func concat(a, b []uint32) []uint32 { return append(append([]uint32(nil), a...), b...) }

// depths is how many leading blocks of toks each worker holds, per the
// cluster's index.
func depths(c *Cluster, toks []uint32) map[kv.WorkerKey]int {
	local := kv.LocalHashes(nil, toks, e2eBlockSize, kv.Seed("", ""))
	out := map[kv.WorkerKey]int{}
	for _, m := range c.index.FindMatches(local, nil) {
		out[m.Worker] = int(m.Depth[kv.NumTiers-1])
	}
	return out
}

func routed(c *Cluster) map[kv.WorkerKey]bool {
	out := map[kv.WorkerKey]bool{}
	for _, wi := range c.router.Workers(e2eModel, kv.RoleAggregated) {
		out[wi.Key] = true
	}
	return out
}

// waitFor and gatherMetrics are this package's short names for testutil's.
var (
	waitFor       = testutil.WaitFor
	gatherMetrics = testutil.Metrics
)

// logSink collects the in-process log for assertions and failure output.
type logSink struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

func (s *logSink) count(substr string) int { return strings.Count(s.String(), substr) }

// 1. Requests sharing a long prefix go to the worker that holds it; only
// that worker's cache serves them.
func testPrefixAffinity(t *testing.T, bin string) {
	e := newE2E(t, bin)
	ws := e.startWorkers(3)
	c := e.newCluster(clusterOpts{})
	e.waitSynced(c, ws...)

	const prefixLen = 2048 // 32 blocks
	prefixes := [][]uint32{prompt(1, prefixLen), prompt(2, prefixLen)}
	owner := map[int]kv.WorkerKey{}
	for round := range 4 {
		for pi, p := range prefixes {
			toks := concat(p, prompt(uint64(100+10*round+pi), 40))
			res, err := generate(e.ctx, c, e2eModel, toks, 4)
			if err != nil {
				t.Fatalf("round %d prefix %d: %v", round, pi, err)
			}
			if res.prompt != len(toks) || res.tokens != 4 {
				t.Fatalf("usage: prompt %d tokens %d, want %d and 4", res.prompt, res.tokens, len(toks))
			}
			if round == 0 {
				owner[pi] = res.worker
				if res.cached != 0 {
					t.Fatalf("first request of prefix %d had %d cached tokens", pi, res.cached)
				}
				// The router knows only what events told it: wait until
				// the owner's blocks are in the index before relying on it.
				waitFor(t, 15*time.Second, "prefix in the index", func() bool {
					return depths(c, p)[res.worker] == prefixLen/e2eBlockSize
				})
				continue
			}
			if res.worker != owner[pi] {
				t.Fatalf("round %d: prefix %d went to %v, its blocks are on %v", round, pi, res.worker, owner[pi])
			}
			if res.cached < prefixLen {
				t.Fatalf("round %d prefix %d: %d cached tokens, want ≥ %d", round, pi, res.cached, prefixLen)
			}
		}
	}
	// Nobody else has the prefixes.
	for pi, p := range prefixes {
		for w, d := range depths(c, p) {
			if w != owner[pi] && d > 0 {
				t.Fatalf("prefix %d: %v holds %d blocks but never served it", pi, w, d)
			}
		}
	}
	e.waitIndexMatches(c, ws...)
	t.Logf("prefix owners: %v; feed %+v", owner, c.feeds[e2eModel].Stats())
}

// 2. A SIGKILLed worker leaves routing within the discovery TTL and gets no
// request after that.
func testKilledWorker(t *testing.T, bin string) {
	e := newE2E(t, bin)
	ws := e.startWorkers(3)
	c := e.newCluster(clusterOpts{})
	e.waitSynced(c, ws...)

	p := prompt(7, 1024)
	first, err := generate(e.ctx, c, e2eModel, concat(p, prompt(8, 8)), 2)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "prefix in the index", func() bool { return depths(c, p)[first.worker] > 0 })
	victim := e.workers[first.worker.Instance]
	victim.proc.Kill()
	killed := time.Now()

	// The router still believes in it: the request fails as a lost worker
	// (so the frontend would migrate it), not as the client's fault.
	if _, err := generate(e.ctx, c, e2eModel, concat(p, prompt(9, 8)), 2); !errors.Is(err, kv.ErrWorkerLost) {
		t.Fatalf("request to the killed worker: %v, want kv.ErrWorkerLost", err)
	}
	waitFor(t, e2eTTL+4*time.Second, "killed worker out of routing", func() bool { return !routed(c)[first.worker] })
	gone := time.Since(killed)
	t.Logf("killed worker left routing after %v (TTL %v)", gone.Round(10*time.Millisecond), e2eTTL)
	waitFor(t, 10*time.Second, "killed worker out of the index", func() bool { return depths(c, p)[first.worker] == 0 })

	// Past the inhibit window, only discovery keeps it out.
	time.Sleep(300 * time.Millisecond)
	for i := range 8 {
		res, err := generate(e.ctx, c, e2eModel, concat(p, prompt(uint64(20+i), 8)), 2)
		if err != nil {
			t.Fatalf("request %d after removal: %v", i, err)
		}
		if res.worker == first.worker {
			t.Fatalf("request %d after removal went to the killed worker", i)
		}
	}
	if s := c.feeds[e2eModel].Stats(); s.InstancesRemoved != 1 {
		t.Fatalf("feed saw %d removals, want 1", s.InstancesRemoved)
	}
}

// 3. A NATS restart (same port, same data dir) loses nothing: workers and
// the cluster reconnect, routing never stops, and the index re-syncs.
func testNATSRestart(t *testing.T, bin string) {
	e := newE2E(t, bin)
	ws := e.startWorkers(3)
	c := e.newCluster(clusterOpts{})
	e.waitSynced(c, ws...)
	for i := range 6 {
		if _, err := generate(e.ctx, c, e2eModel, prompt(uint64(300+i), 256), 2); err != nil {
			t.Fatal(err)
		}
	}
	e.waitIndexMatches(c, ws...)

	e.srv.Shutdown()
	// Routing goes on while NATS is away; these requests' events are
	// published after the workers reconnect, possibly before the cluster
	// has resubscribed: gaps the feed must repair.
	for i := range 6 {
		if _, err := generate(e.ctx, c, e2eModel, prompt(uint64(400+i), 256), 2); err != nil {
			t.Fatalf("request during the outage: %v", err)
		}
	}
	srv, err := natsbus.StartEmbedded(natsbus.EmbeddedConfig{Port: e.port, DataDir: e.dir})
	if err != nil {
		t.Fatal(err)
	}
	e.srv = srv
	waitFor(t, 10*time.Second, "cluster reconnected", e.nc.IsConnected)
	for i := range 6 {
		if _, err := generate(e.ctx, c, e2eModel, prompt(uint64(500+i), 256), 2); err != nil {
			t.Fatalf("request after the restart: %v", err)
		}
	}
	e.waitSynced(c, ws...)
	e.waitIndexMatches(c, ws...)
	// The workers kept their records alive on the new server.
	time.Sleep(e2eTTL)
	if n := len(c.router.Workers(e2eModel, kv.RoleAggregated)); n != 3 {
		t.Fatalf("%d workers routable one TTL after the restart, want 3", n)
	}
	t.Logf("feed after restart: %+v", c.feeds[e2eModel].Stats())
}

// 4. Events lost between the workers and the cluster (a partition of the
// cluster's NATS link) are found as gaps and repaired: a short gap from the
// worker's event ring, a long one (past a small ring) by a full dump, and
// one at the end of an idle worker's stream from its load reports. The
// index then equals each worker's own.
func testEventGap(t *testing.T, bin string) {
	e := newE2E(t, bin)
	ring := e.startWorker()
	small := e.startWorker("--event-ring", "8", "--speedup-ratio", "0")
	idle := e.startWorker("--speedup-ratio", "0")
	px := newTCPProxy(t, e.srv.URL())
	nc := e.connect(px.url())
	reg := prometheus.NewRegistry()
	c := e.newCluster(clusterOpts{nc: nc, disc: e.openDiscovery(nc), reg: reg})
	e.waitSynced(c, ring, small, idle)
	e.generateDirect(ring, prompt(600, 256))
	e.generateDirect(small, prompt(601, 256))
	e.generateDirect(idle, prompt(602, 256))
	e.waitIndexMatches(c, ring, small, idle)
	before := c.feeds[e2eModel].Stats()

	px.cut()
	waitFor(t, 15*time.Second, "cluster link down", func() bool { return !nc.IsConnected() })
	// Lost for the cluster: two batches on one worker, far more than its
	// ring on the other.
	e.generateDirect(ring, prompt(602, 256))
	e.generateDirect(ring, prompt(603, 256))
	for i := range 12 {
		e.generateDirect(small, prompt(uint64(700+i), 256))
	}
	e.generateDirect(idle, prompt(606, 256)) // and nothing after

	px.heal()
	waitFor(t, 15*time.Second, "cluster link up", nc.IsConnected)
	if err := nc.Flush(); err != nil { // the feed's subscription is back
		t.Fatal(err)
	}
	// The next events reveal the gaps.
	e.generateDirect(ring, prompt(604, 256))
	e.generateDirect(small, prompt(605, 256))
	e.waitIndexMatches(c, ring, small, idle)

	after := c.feeds[e2eModel].Stats()
	if after.TailGaps <= before.TailGaps {
		t.Fatalf("tail gaps %d → %d, want more (the idle worker)", before.TailGaps, after.TailGaps)
	}
	if after.Gaps-before.Gaps < 2 {
		t.Fatalf("gaps %d → %d, want two more", before.Gaps, after.Gaps)
	}
	if after.RangeRepairs <= before.RangeRepairs {
		t.Fatalf("range repairs %d → %d, want more (the short gap)", before.RangeRepairs, after.RangeRepairs)
	}
	if after.DumpRepairs <= before.DumpRepairs {
		t.Fatalf("dump repairs %d → %d, want more (the gap past the ring)", before.DumpRepairs, after.DumpRepairs)
	}
	if after.BadMessages != 0 {
		t.Fatalf("bad messages: %+v", after)
	}
	// The feed's counters are on the cluster's registry.
	got := gatherMetrics(t, reg)
	for k, v := range map[string]int64{
		`kvmesh_event_feed_gaps_total{kind="sequence",model="m"}`: after.Gaps - after.TailGaps,
		`kvmesh_event_feed_gaps_total{kind="tail",model="m"}`:     after.TailGaps,
		`kvmesh_event_feed_repairs_total{kind="range",model="m"}`: after.RangeRepairs,
		`kvmesh_event_feed_repairs_total{kind="dump",model="m"}`:  after.DumpRepairs,
	} {
		if got[k] != float64(v) {
			t.Errorf("%s = %v, stats say %d", k, got[k], v)
		}
	}
	t.Logf("feed before %+v\nfeed after  %+v", before, after)
}

// 5. Two replicas that share bookings see the same load while requests
// from both are in flight, and both return to zero.
func testReplicaSync(t *testing.T, bin string) {
	e := newE2E(t, bin)
	ws := e.startWorkers(3)
	a := e.newCluster(clusterOpts{replicaSync: true})
	nc2 := e.connect(e.url)
	b := e.newCluster(clusterOpts{nc: nc2, disc: e.openDiscovery(nc2), replicaSync: true})
	e.waitSynced(a, ws...)
	e.waitSynced(b, ws...)

	// Open streams from both replicas and hold them unread: their bookings
	// stay until they end.
	var streams []kv.TokenStream
	for i := range 8 {
		c := a
		if i%2 == 1 {
			c = b
		}
		st, err := c.Generate(e.ctx, &kv.GenerateRequest{Model: e2eModel, Tokens: prompt(uint64(800+i), 300+50*i), Sampling: kv.Sampling{MaxTokens: 3}})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	defer func() {
		for _, st := range streams {
			st.Close()
		}
	}()
	booked := func(c *Cluster) []router.WorkerLoad {
		var out []router.WorkerLoad
		for _, l := range c.router.Loads() {
			l.KVUsage = 0 // from load reports, which each replica gets at its own time
			out = append(out, l)
		}
		return out
	}
	total := func(ls []router.WorkerLoad) (reqs, prefill int64) {
		for _, l := range ls {
			reqs += l.ActiveRequests
			prefill += l.ActivePrefillTokens
		}
		return
	}
	same := func(wantReqs int64, prefill bool) func() bool {
		return func() bool {
			la, lb := booked(a), booked(b)
			r, p := total(la)
			return reflect.DeepEqual(la, lb) && r == wantReqs && (p > 0) == prefill
		}
	}
	why := func() string { return fmt.Sprintf("a %+v\nb %+v", booked(a), booked(b)) }
	waitFor(t, 15*time.Second, "replicas agree on 8 bookings in prefill", same(8, true), why)
	// First tokens end the prefill part of each booking on both.
	for _, st := range streams {
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 15*time.Second, "replicas agree on 8 bookings past prefill", same(8, false), why)
	for _, st := range streams {
		for {
			ch, err := st.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if ch.Finish != "" {
				break
			}
		}
	}
	waitFor(t, 15*time.Second, "replicas back to zero", same(0, false), why)
}

// 6. Bad input never crashes the cluster or routes to a dead worker after
// the TTL: records that do not parse, an unknown model, an instance whose
// address refuses connections, a worker killed mid-stream and one that
// hangs mid-stream.
func testBadInput(t *testing.T, bin string) {
	e := newE2E(t, bin)
	ws := e.startWorkers(3)
	c := e.newCluster(clusterOpts{})
	e.waitSynced(c, ws...)
	kvb := e.rawBucket()
	watcher := c.watchers[0]

	// Garbage records under the model's key space.
	tok := natsbus.ModelToken(e2eModel)
	garbage := map[string]string{
		tok + ".zz-not-hex": `{}`,
		tok + ".abc":        `{not json`,
		tok + ".abd":        `{"instance_id":2749,"model":"other","role":"aggregated","grpc_addr":"127.0.0.1:1","dp_size":1,"block_size":64}`,
		tok + ".abe":        `{"instance_id":2750,"model":"m","role":"aggregated","grpc_addr":"127.0.0.1:1","dp_size":0,"block_size":64}`,
		tok + ".abf":        `{"instance_id":2751,"model":"m","role":"boss","grpc_addr":"0.0.0.0:80","dp_size":1,"block_size":64}`,
	}
	for k, v := range garbage {
		if _, err := kvb.Put(e.ctx, k, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 15*time.Second, "bad records counted", func() bool { return watcher.BadRecords() >= int64(len(garbage)) })
	// The watcher counts a bad record before it logs it: wait for the log.
	waitFor(t, 15*time.Second, "bad records logged", func() bool { return e.logs.count("skipping bad record") >= len(garbage) })
	if n := len(routed(c)); n != 3 {
		t.Fatalf("%d workers routable after garbage records, want 3", n)
	}

	// An unknown model.
	if _, err := c.Generate(e.ctx, &kv.GenerateRequest{Model: "no-such-model", Tokens: prompt(1, 16), Sampling: kv.Sampling{MaxTokens: 1}}); !errors.Is(err, kv.ErrNoWorkers) {
		t.Fatalf("unknown model: %v, want ErrNoWorkers", err)
	}

	// An instance whose address refuses connections: registered once, never
	// refreshed, like a worker that died right after registering.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := ln.Addr().String()
	ln.Close()
	dead := kv.WorkerKey{Instance: 0xdead}
	rec := fmt.Sprintf(`{"instance_id":%d,"model":"m","role":"aggregated","grpc_addr":%q,"dp_size":1,"block_size":%d,"kv_capacity":{"device":4096}}`,
		dead.Instance, deadAddr, e2eBlockSize)
	if _, err := kvb.Put(e.ctx, tok+"."+natsbus.InstanceToken(dead.Instance), []byte(rec)); err != nil {
		t.Fatal(err)
	}
	deadAt := time.Now()

	// A worker that hangs mid-stream (SIGSTOP: sockets open, no answers, no
	// discovery refresh) and one that dies mid-stream (SIGKILL).
	long := func(seed uint64) (kv.TokenStream, *e2eWorker) {
		for {
			st, err := c.Generate(e.ctx, &kv.GenerateRequest{Model: e2eModel, Tokens: prompt(seed, 128), Sampling: kv.Sampling{MaxTokens: 3000}})
			if errors.Is(err, kv.ErrWorkerLost) {
				seed += 1000 // routed to the dead instance: try again
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := st.Recv(); err != nil {
				t.Fatal(err)
			}
			return st, e.workers[asWorkerStream(st).d.Worker.Instance]
		}
	}
	hangSt, hung := long(900)
	defer hangSt.Close()
	dieSt, died := long(901)
	defer dieSt.Close()
	for died == hung {
		dieSt.Close()
		dieSt, died = long(uint64(902 + time.Now().UnixNano()%1000))
	}
	if err := hung.proc.Signal(syscallSIGSTOP); err != nil {
		t.Fatal(err)
	}
	stoppedAt := time.Now()
	died.proc.Kill()
	diedAt := time.Now()
	if err := drain(dieSt); !errors.Is(err, kv.ErrWorkerLost) {
		t.Fatalf("stream of the killed worker: %v, want kv.ErrWorkerLost", err)
	}
	t.Logf("killed worker's stream failed after %v", time.Since(diedAt).Round(time.Millisecond))
	// The hung worker's stream fails once discovery drops it.
	if err := drain(hangSt); !errors.Is(err, kv.ErrWorkerLost) {
		t.Fatalf("stream of the hung worker: %v, want kv.ErrWorkerLost", err)
	}
	t.Logf("hung worker's stream failed after %v (TTL %v)", time.Since(stoppedAt).Round(time.Millisecond), e2eTTL)

	alive := ws[0]
	for _, w := range ws {
		if w != hung && w != died {
			alive = w
		}
	}
	waitFor(t, e2eTTL+4*time.Second, "dead workers out of routing", func() bool {
		r := routed(c)
		return len(r) == 1 && r[alive.key()]
	}, func() string { return fmt.Sprint(routed(c)) })
	t.Logf("unreachable instance out of routing within %v", time.Since(deadAt).Round(time.Millisecond))
	if time.Since(deadAt) > e2eTTL+4*time.Second {
		t.Fatalf("unreachable instance routable for %v", time.Since(deadAt))
	}
	time.Sleep(300 * time.Millisecond) // past the inhibit window
	for i := range 10 {
		res, err := generate(e.ctx, c, e2eModel, prompt(uint64(1000+i), 64), 1)
		if err != nil {
			t.Fatalf("request %d after the TTL: %v", i, err)
		}
		if res.worker != alive.key() {
			t.Fatalf("request %d after the TTL went to %v", i, res.worker)
		}
	}
	st := c.feeds[e2eModel].Stats()
	if st.RepairErrors == 0 {
		t.Fatalf("no failed dump of the unreachable instance counted: %+v", st)
	}
	if !strings.Contains(e.logs.String(), "repair failed") {
		t.Fatal("failed dump of the unreachable instance not logged")
	}
	if st.InstancesRemoved < 3 {
		t.Fatalf("feed removed %d instances, want 3: %+v", st.InstancesRemoved, st)
	}
	t.Logf("watcher: %d bad records; feed %+v", watcher.BadRecords(), st)
}

func drain(st kv.TokenStream) error {
	for {
		ch, err := st.Recv()
		if err != nil {
			return err
		}
		if ch.Finish != "" {
			return nil
		}
	}
}
