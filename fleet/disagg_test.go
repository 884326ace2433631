package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/worker"
)

const pdModel = "pd"

// seen is one request as an engine received it, and the connector
// parameters it answered with.
type seen struct {
	id      string
	leg     kv.Leg
	hint    bool
	params  []byte
	answer  []byte
	decoded int // tokens it produced
}

// recEngine records what reaches a sim engine through the worker, and can
// fail prefill legs or spoil their answers.
type recEngine struct {
	*sim.Engine
	mu   sync.Mutex
	seen []*seen

	failPrefills *atomic.Int32 // close this many prefill legs' streams with no answer (shared by a fleet)
	deadSource   atomic.Bool   // answer with an unreachable control endpoint
	onAnswer     func()        // called when a prefill answer passes
	answered     atomic.Uint64 // prefill answers with parameters
	upFront      atomic.Pointer[upFront]
}

func (e *recEngine) Generate(ctx context.Context, req *engine.Request) (<-chan engine.Chunk, error) {
	s := &seen{id: req.ID, leg: req.Leg, hint: req.KVHint != nil, params: slices.Clone(req.TransferParams)}
	e.mu.Lock()
	e.seen = append(e.seen, s)
	e.mu.Unlock()
	if u := e.upFront.Load(); u != nil {
		if ch, ok := u.generate(ctx, e, req, s); ok {
			return ch, nil
		}
	}
	if req.Leg == kv.LegPrefill && e.failPrefills.Add(-1) >= 0 {
		out := make(chan engine.Chunk)
		close(out) // the worker ends the stream without a finish: a lost worker
		return out, nil
	}
	in, err := e.Engine.Generate(ctx, req)
	if err != nil {
		return nil, err
	}
	out := make(chan engine.Chunk, 1)
	go func() {
		defer close(out)
		for c := range in {
			s.decoded += len(c.Tokens)
			if c.TransferParams != nil {
				if e.deadSource.Load() {
					c.TransferParams = []byte(fmt.Sprintf(`{"kvmesh_sim_handoff":1,"endpoint":"tcp://127.0.0.1:1","request_id":%q,"block_hashes":%s}`,
						req.ID, handoffHashes(c.TransferParams)))
				}
				s.answer = slices.Clone(c.TransferParams)
				e.answered.Add(1)
				if e.onAnswer != nil {
					e.onAnswer()
				}
			}
			out <- c
		}
	}()
	return out, nil
}

func handoffHashes(b []byte) string {
	h, err := sim.ParseHandoff(b)
	if err != nil {
		return "[]"
	}
	parts := make([]string, len(h.Hashes))
	for i, x := range h.Hashes {
		parts[i] = fmt.Sprint(uint64(x))
	}
	return "[" + strings.Join(parts, ",") + "]"
}

func (e *recEngine) requests(id string) []*seen {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []*seen
	for _, s := range e.seen {
		if s.id == id {
			out = append(out, s)
		}
	}
	return out
}

type pdFleet struct {
	c       *Cluster
	reg     *prometheus.Registry
	prefill []*recEngine
	decode  []*recEngine
	agg     []*recEngine
	keys    map[*recEngine]kv.WorkerKey
	workers map[*recEngine]*worker.Worker
	fails   atomic.Int32 // prefill legs to fail, on whichever workers they reach
}

// startPD runs np prefill, nd decode and na aggregated sim workers serving
// their caches on loopback, and a KV-mode cluster with hints over them.
func startPD(t *testing.T, np, nd, na int, ttl time.Duration) *pdFleet {
	t.Helper()
	return startPDWith(t, np, nd, na, ttl, worker.Config{})
}

// startPDWith is startPD with every worker's config starting from wc.
func startPDWith(t *testing.T, np, nd, na int, ttl time.Duration, wc worker.Config, opts ...func(*Config)) *pdFleet {
	t.Helper()
	_, nc, _ := controlPlane(t, 3*time.Second)
	reg := prometheus.NewRegistry()
	pm, err := worker.NewPeerMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	disc := discovery.Config{TTL: 3 * time.Second, Memory: true}
	f := &pdFleet{reg: reg, keys: map[*recEngine]kv.WorkerKey{}, workers: map[*recEngine]*worker.Worker{}}
	add := func(role kv.Role) *recEngine {
		cfg := sim.DefaultConfig()
		cfg.Model, cfg.Role = pdModel, role
		cfg.SpeedupRatio = 10
		cfg.Disagg.TTL = ttl
		eng, p, err := newSimPeer(cfg, worker.PeerConfig{Listen: "127.0.0.1:0", AdvertiseHost: "127.0.0.1", Metrics: pm})
		if err != nil {
			t.Fatal(err)
		}
		re := &recEngine{Engine: eng, failPrefills: &f.fails}
		c := wc
		c.Peer, c.Discovery, c.LoadInterval, c.Registerer = p, disc, time.Hour, reg
		w, err := worker.New(c, re, nc)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Close() })
		f.keys[re] = kv.WorkerKey{Instance: w.InstanceID()}
		f.workers[re] = w
		return re
	}
	for range np {
		f.prefill = append(f.prefill, add(kv.RolePrefill))
	}
	for range nd {
		f.decode = append(f.decode, add(kv.RoleDecode))
	}
	for range na {
		f.agg = append(f.agg, add(kv.RoleAggregated))
	}
	d, err := discovery.Open(ctx, nc, disc)
	if err != nil {
		t.Fatal(err)
	}
	cc := Config{NC: nc, Discovery: d, Models: []string{pdModel}, Registerer: reg,
		Router: router.Config{Mode: router.ModeKV, Hints: true, MaxKVUsage: 0.9, InhibitFor: 100 * time.Millisecond}, Logger: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(&cc)
	}
	f.c, err = New(ctx, cc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.c.Close)
	waitFor(t, 10*time.Second, "cluster sees every worker", func() bool {
		p := f.c.router.PoolSizes(pdModel)
		return p.Prefill == np && p.Decode == nd && p.Agg == na
	})
	return f
}

type pdResult struct {
	toks   []uint32
	finish kv.FinishReason
	cached int
	err    error
}

func pdTurn(ctx context.Context, c *Cluster, id string, toks []uint32, maxTokens int) pdResult {
	st, err := c.Generate(ctx, &kv.GenerateRequest{RequestID: id, Model: pdModel, Tokens: toks, Sampling: kv.Sampling{MaxTokens: maxTokens, Seed: 99}})
	if err != nil {
		return pdResult{err: err}
	}
	defer st.Close()
	var r pdResult
	for {
		ch, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return r
		}
		if err != nil {
			r.err = err
			return r
		}
		r.toks = append(r.toks, ch.Tokens...)
		if ch.Finish != "" {
			r.finish, r.cached = ch.Finish, ch.CachedTokens
			return r
		}
	}
}

// reference is the answer of a cold aggregated sim engine.
func reference(t *testing.T, toks []uint32, maxTokens int) []uint32 {
	cfg := sim.DefaultConfig()
	cfg.SpeedupRatio = 0
	e, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	return generateOn(t, e, &engine.Request{ID: "ref", Tokens: toks, Sampling: kv.Sampling{MaxTokens: maxTokens, Seed: 99}}).toks
}

func legsOf(es []*recEngine, id string, leg kv.Leg) []*seen {
	var out []*seen
	for _, e := range es {
		for _, s := range e.requests(id) {
			if s.leg == leg {
				out = append(out, s)
			}
		}
	}
	return out
}

func (f *pdFleet) metric(t *testing.T, name string) float64 {
	return gatherMetrics(t, f.reg)[name]
}

// The prefill-first flow: a cold long prompt is disaggregated (the prefill
// leg carries the router's hint when there is one, the decode leg never
// does and gets the prefill's answer whole), the decode worker pulls the
// prompt's blocks and the answer equals an aggregated engine's; a short
// follow-up turn the decode worker mostly holds prefills locally; a
// one-token request has no decode leg.
func TestDisaggPrefillFirst(t *testing.T) {
	f := startPD(t, 2, 2, 0, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	turn1 := prompt(7, 3000)
	r := pdTurn(ctx, f.c, "t1", turn1, 8)
	if r.err != nil || r.finish != kv.FinishLength || !slices.Equal(r.toks, reference(t, turn1, 8)) {
		t.Fatalf("turn 1: %+v", r)
	}
	pre, dec := legsOf(f.prefill, "t1", kv.LegPrefill), legsOf(f.decode, "t1", kv.LegDecode)
	if len(pre) != 1 || len(dec) != 1 || pre[0].answer == nil || string(dec[0].params) != string(pre[0].answer) || dec[0].hint {
		t.Fatalf("legs: prefill %+v decode %+v", pre, dec)
	}
	if dec[0].decoded != 8 || pre[0].decoded != 1 {
		t.Fatalf("prefill produced %d tokens, decode %d", pre[0].decoded, dec[0].decoded)
	}
	nblocks := len(turn1) / sim.DefaultBlockSize
	var pulled, pinned, read uint64
	for _, e := range f.decode {
		pulled += e.HandoffStats().PulledBlks
	}
	for _, e := range f.prefill {
		st := e.HandoffStats()
		pinned += uint64(st.PinnedBlocks)
		read += st.Read
	}
	if pulled != uint64(nblocks) || read != 1 || pinned != 0 {
		t.Fatalf("pulled %d of %d blocks; %d read, %d still pinned", pulled, nblocks, read, pinned)
	}
	if r.cached != 0 {
		t.Fatalf("cached_tokens %d: pulled blocks are not cache hits", r.cached)
	}

	// Turn 2 extends turn 1 a little: the decode worker that served turn 1
	// holds most of it, so it prefills locally (reason isl).
	turn2 := concat(turn1, prompt(8, 200))
	r2 := pdTurn(ctx, f.c, "t2", turn2, 8)
	if r2.err != nil || !slices.Equal(r2.toks, reference(t, turn2, 8)) {
		t.Fatalf("turn 2: %+v", r2)
	}
	if got := legsOf(f.decode, "t2", kv.LegWhole); len(got) != 1 || legsOf(f.prefill, "t2", kv.LegPrefill) != nil {
		t.Fatalf("turn 2 did not prefill locally: %+v", got)
	}
	if r2.cached < nblocks*sim.DefaultBlockSize {
		t.Fatalf("turn 2 cached %d, want ≥ %d", r2.cached, nblocks*sim.DefaultBlockSize)
	}

	// A hint on the prefill leg: turn 3 shares turn 1's prefix with the
	// prefill worker that computed it, which is now full, so the other one
	// is picked and hinted to fetch the prefix.
	holder := slices.IndexFunc(f.prefill, func(e *recEngine) bool { return e.HandoffStats().Prefills == 1 })
	f.c.router.UpdateLoad(f.keys[f.prefill[holder]], 100, 100, 0, 0)
	waitFor(t, 10*time.Second, "index holds turn 1 on the prefill worker", func() bool {
		local, _ := kv.NewHasher(sim.DefaultBlockSize, "", "").Blocks(turn1)
		for _, m := range f.c.index.FindMatches(local, nil) {
			if m.Worker == f.keys[f.prefill[holder]] && int(m.Depth[kv.TierDevice]) == nblocks {
				return true
			}
		}
		return false
	})
	turn3 := concat(turn1, prompt(9, 3000))
	r3 := pdTurn(ctx, f.c, "t3", turn3, 5)
	if r3.err != nil || !slices.Equal(r3.toks, reference(t, turn3, 5)) {
		t.Fatalf("turn 3: %+v", r3)
	}
	pre3, dec3 := legsOf(f.prefill, "t3", kv.LegPrefill), legsOf(f.decode, "t3", kv.LegDecode)
	if len(pre3) != 1 || !pre3[0].hint || len(dec3) != 1 || dec3[0].hint || string(dec3[0].params) != string(pre3[0].answer) {
		t.Fatalf("turn 3 legs: prefill %+v decode %+v", pre3, dec3)
	}
	if r3.cached != nblocks*sim.DefaultBlockSize {
		t.Fatalf("turn 3 cached %d (the prefill's hinted prefix), want %d", r3.cached, nblocks*sim.DefaultBlockSize)
	}
	// The router credited the hinted prefill worker with turn 1's prefix
	// from a peer; decode legs compute no prompt and are credited nothing.
	if v := testutil.Value(t, f.reg, "kvmesh_fleet_worker_credited_prompt_tokens_total", "tier", "peer", "role", "prefill"); v != float64(nblocks*sim.DefaultBlockSize) {
		t.Errorf("peer credit %v, want %d", v, nblocks*sim.DefaultBlockSize)
	}
	if v := testutil.Value(t, f.reg, "kvmesh_fleet_worker_routed_prompt_tokens_total", "role", "prefill"); v != float64(len(turn1)+len(turn3)) {
		t.Errorf("prefill workers' routed prompt tokens %v, want %d", v, len(turn1)+len(turn3))
	}
	// What the workers actually served, by tier: the prefill workers only
	// turn 3's hinted prefix, from a peer; the decode workers turn 1's
	// handoff from a peer, and turn 2's local prefill from their device.
	actual := func(role, tier string) float64 {
		return testutil.Value(t, f.reg, "kvmesh_fleet_worker_cached_prompt_tokens_by_tier_total", "tier", tier, "role", role)
	}
	if p, d := actual("prefill", "peer"), actual("prefill", "device"); p != float64(nblocks*sim.DefaultBlockSize) || d != 0 {
		t.Errorf("prefill workers' actual hits: peer %v, device %v; want peer %d, device 0", p, d, nblocks*sim.DefaultBlockSize)
	}
	if p, d := actual("decode", "peer"), actual("decode", "device"); p < float64(nblocks*sim.DefaultBlockSize) || d < float64(nblocks*sim.DefaultBlockSize) {
		t.Errorf("decode workers' actual hits: peer %v, device %v; want both ≥ %d", p, d, nblocks*sim.DefaultBlockSize)
	}

	// One token wanted: the prefill's answer is final.
	r4 := pdTurn(ctx, f.c, "t4", prompt(10, 3000), 1)
	if r4.err != nil || len(r4.toks) != 1 || legsOf(f.decode, "t4", kv.LegDecode) != nil {
		t.Fatalf("max_tokens 1: %+v", r4)
	}
	if v := f.metric(t, `kvmesh_fleet_requests_by_path_total{path="disagg",reason=""}`); v != 3 {
		t.Errorf("disagg requests %v, want 3", v)
	}
	if v := f.metric(t, `kvmesh_fleet_requests_by_path_total{path="local_prefill",reason="isl"}`); v != 1 {
		t.Errorf("local prefills %v, want 1", v)
	}
	// Routing decisions: one per leg; the one-token request had no decode leg.
	for path, want := range map[string]float64{"disagg_prefill": 3, "disagg_decode": 2, "local_prefill": 1, "aggregated": 0} {
		if v := f.metric(t, `kvmesh_router_decisions_total{mode="kv",path="`+path+`"}`); v != want {
			t.Errorf("%s decisions %v, want %v", path, v, want)
		}
	}
}

// Failures: a prefill worker lost before answering is retried on the other;
// one whose blocks cannot be pulled costs the decode a recompute; a client
// that leaves between the legs leaves no pinned blocks past the expiry.
func TestDisaggFailures(t *testing.T) {
	f := startPD(t, 2, 1, 0, 300*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := prompt(20, 3000)
	want := reference(t, p, 6)

	// The prefill worker the router picks first is lost before answering.
	f.fails.Store(1)
	r := pdTurn(ctx, f.c, "lost", p, 6)
	if r.err != nil || !slices.Equal(r.toks, want) {
		t.Fatalf("lost prefill: %+v", r)
	}
	if v := f.metric(t, "kvmesh_fleet_prefill_retries_total"); v != 1 {
		t.Errorf("prefill retries %v, want 1", v)
	}
	if got := legsOf(f.prefill, "lost", kv.LegPrefill); len(got) != 2 || (got[0].answer == nil) == (got[1].answer == nil) {
		t.Errorf("prefill legs %+v, want a lost one and an answer", got)
	}
	// With every prefill worker lost, the decode worker prefills locally.
	p1 := prompt(23, 3000)
	f.fails.Store(5)
	if r := pdTurn(ctx, f.c, "all-lost", p1, 6); r.err != nil || !slices.Equal(r.toks, reference(t, p1, 6)) {
		t.Fatalf("all prefill workers lost: %+v", r)
	}
	if v := f.metric(t, `kvmesh_fleet_requests_by_path_total{path="local_prefill",reason="prefill_failed"}`); v != 1 {
		t.Errorf("prefill_failed local prefills %v, want 1", v)
	}
	f.fails.Store(0)
	time.Sleep(200 * time.Millisecond) // the lost workers' inhibition lapses

	for _, e := range f.prefill {
		e.deadSource.Store(true)
	}
	p2 := prompt(21, 3000)
	r = pdTurn(ctx, f.c, "dead", p2, 6)
	if r.err != nil || !slices.Equal(r.toks, reference(t, p2, 6)) {
		t.Fatalf("dead source: %+v %v", r, r.err)
	}
	if st := f.decode[0].HandoffStats(); st.Failures != 1 || st.Recomputes != 1 {
		t.Fatalf("decode after a dead source: %+v", st)
	}
	for _, e := range f.prefill {
		e.deadSource.Store(false)
	}

	// The client leaves as soon as the prefill answers.
	cctx, ccancel := context.WithCancel(ctx)
	defer ccancel()
	for _, e := range f.prefill {
		e.onAnswer = ccancel
	}
	r = pdTurn(cctx, f.c, "gone", prompt(22, 3000), 6)
	if r.err == nil {
		t.Fatalf("a cancelled request succeeded: %+v", r)
	}
	if legsOf(f.decode, "gone", kv.LegDecode) != nil {
		t.Fatal("a decode leg ran for a client that left")
	}
	waitFor(t, 10*time.Second, "pinned prefill blocks released", func() bool {
		var n int64
		for _, e := range f.prefill {
			n += e.HandoffStats().PinnedBlocks
		}
		return n == 0
	})
	if v := f.metric(t, "kvmesh_disagg_pinned_blocks"); v != 0 {
		t.Errorf("pinned blocks metric %v", v)
	}
}

// Health and errors when a pool is missing, and a mixed fleet.
func TestDisaggPools(t *testing.T) {
	f := startPD(t, 1, 0, 0, time.Minute)
	if err := f.c.Ready(); err == nil || !strings.Contains(err.Error(), "prefill workers but no decode workers") {
		t.Fatalf("Ready: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := pdTurn(ctx, f.c, "x", prompt(1, 100), 4)
	if !errors.Is(r.err, kv.ErrNoWorkers) || !strings.Contains(r.err.Error(), "no decode workers") {
		t.Fatalf("generate without a decode pool: %v", r.err)
	}

	if w := f.c.Warnings(); w != nil {
		t.Fatalf("warnings %v without an aggregated pool (Ready says it)", w)
	}
	// Aggregated workers serve a model whose P/D pool is half there, and
	// /health warns.
	h := startPD(t, 0, 1, 1, time.Minute)
	if err := h.c.Ready(); err != nil {
		t.Fatal(err)
	}
	if w := h.c.Warnings(); len(w) != 1 || !strings.Contains(w[0], "1 decode workers but no prefill workers; the aggregated workers serve it") {
		t.Fatalf("warnings %v", w)
	}
	if r := pdTurn(ctx, h.c, "half", prompt(2, 3000), 4); r.err != nil || legsOf(h.agg, "half", kv.LegWhole) == nil {
		t.Fatalf("half P/D fleet: %+v", r)
	}

	m := startPD(t, 1, 1, 1, time.Minute)
	if err := m.c.Ready(); err != nil || m.c.Warnings() != nil {
		t.Fatal(err, m.c.Warnings())
	}
	for i := range 4 {
		p := prompt(uint64(30+i), 3000)
		if r := pdTurn(ctx, m.c, fmt.Sprint("m", i), p, 4); r.err != nil || !slices.Equal(r.toks, reference(t, p, 4)) {
			t.Fatalf("mixed fleet request %d: %+v", i, r)
		}
	}
	if v := m.metric(t, `kvmesh_fleet_requests_by_path_total{path="aggregated",reason=""}`); v != 4 {
		t.Errorf("aggregated %v of 4 sequential requests (an idle aggregated pool is preferred)", v)
	}
}

// A decode worker lost mid-stream is a lost worker like an aggregated one:
// the stream fails with kv.ErrWorkerLost, and the attempt the frontend then
// makes (prompt + what was generated) is planned again and continues the
// answer exactly.
func TestDisaggDecodeLostMidStream(t *testing.T) {
	f := startPD(t, 1, 2, 0, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := prompt(40, 3000)
	const n = 400
	want := reference(t, p, n)
	st, err := f.c.Generate(ctx, &kv.GenerateRequest{RequestID: "mig", Model: pdModel, Tokens: p, Sampling: kv.Sampling{MaxTokens: n, Seed: 99}})
	if err != nil {
		t.Fatal(err)
	}
	var got []uint32
	for len(got) < 5 {
		ch, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ch.Tokens...)
	}
	dec := slices.IndexFunc(f.decode, func(e *recEngine) bool { return len(e.requests("mig")) == 1 })
	f.workers[f.decode[dec]].Close()
	var lost error
	for {
		ch, err := st.Recv()
		if err != nil {
			lost = err
			break
		}
		got = append(got, ch.Tokens...)
		if ch.Finish != "" {
			t.Fatalf("the stream finished (%d tokens) before its worker was closed", len(got))
		}
	}
	st.Close()
	if !errors.Is(lost, kv.ErrWorkerLost) {
		t.Fatalf("decode worker closed mid-stream: %v, want kv.ErrWorkerLost", lost)
	}
	rest := pdTurn(ctx, f.c, "mig", concat(p, got), n-len(got))
	if rest.err != nil || !slices.Equal(append(got, rest.toks...), want) {
		t.Fatalf("migrated answer differs (%d + %d tokens): %v", len(got), len(rest.toks), rest.err)
	}
	if legs := legsOf(f.decode[1-dec:2-dec], "mig", kv.LegDecode); len(legs) != 1 {
		t.Fatalf("the continuation ran %d decode legs on the other decode worker", len(legs))
	}
}

// Decode workers that cannot prefill alone (registered decode_only, like
// SGLang's) get decode legs only: a follow-up turn they mostly hold is
// still disaggregated, and with every prefill worker lost the request
// fails with a 503-class error saying why instead of going whole to them.
func TestDisaggDecodeOnly(t *testing.T) {
	f := startPDWith(t, 2, 1, 0, time.Minute, worker.Config{DecodeOnly: true})
	waitFor(t, 10*time.Second, "the decode worker registered decode-only", func() bool {
		ws := f.c.router.Workers(pdModel, kv.RoleDecode)
		return len(ws) == 1 && ws[0].DecodeOnly
	})
	if ws := f.c.router.Workers(pdModel, kv.RolePrefill); len(ws) != 2 || ws[0].DecodeOnly || ws[1].DecodeOnly {
		t.Fatalf("prefill workers %+v: decode_only applies to decode workers only", ws)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	turn1 := prompt(30, 3000)
	turn2 := concat(turn1, prompt(31, 200))
	for _, id := range []string{"t1", "t2"} {
		toks := map[string][]uint32{"t1": turn1, "t2": turn2}[id]
		if r := pdTurn(ctx, f.c, id, toks, 6); r.err != nil || !slices.Equal(r.toks, reference(t, toks, 6)) {
			t.Fatalf("%s: %+v", id, r)
		}
		if pre, dec := legsOf(f.prefill, id, kv.LegPrefill), legsOf(f.decode, id, kv.LegDecode); len(pre) != 1 || len(dec) != 1 {
			t.Fatalf("%s: prefill legs %d, decode legs %d, want 1 each", id, len(pre), len(dec))
		}
	}
	f.fails.Store(5)
	r := pdTurn(ctx, f.c, "all-lost", prompt(32, 3000), 6)
	if !errors.Is(r.err, kv.ErrNoWorkers) || !strings.Contains(r.err.Error(), "cannot prefill alone") {
		t.Fatalf("every prefill worker lost: %+v, want ErrNoWorkers saying the decode workers cannot prefill alone", r)
	}
	for _, id := range []string{"t1", "t2", "all-lost"} {
		if got := legsOf(f.decode, id, kv.LegWhole); len(got) != 0 {
			t.Errorf("%s: %d whole requests reached the decode-only worker", id, len(got))
		}
	}
	if v := f.metric(t, `kvmesh_fleet_requests_by_path_total{path="local_prefill",reason="isl"}`) +
		f.metric(t, `kvmesh_fleet_requests_by_path_total{path="local_prefill",reason="prefill_failed"}`); v != 0 {
		t.Errorf("local prefills counted %v, want 0", v)
	}
}
