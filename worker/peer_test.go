package worker

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/engine/sim/simpeer"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
)

const peerBS = 16

func peerSimConfig(blocks int) sim.Config {
	cfg := sim.DefaultConfig()
	cfg.Model, cfg.BlockSize, cfg.Blocks, cfg.SpeedupRatio = "m", peerBS, blocks, 0
	cfg.Layers, cfg.PayloadSize = 3, 40
	return cfg
}

// servingPeer starts a sim engine with a Peer behind a worker (no NATS)
// that serves it on a loopback control endpoint.
func servingPeer(t *testing.T, blocks int, m *PeerMetrics) (*Worker, *sim.Engine, *Peer) {
	t.Helper()
	eng, p, err := newSimPeer(peerSimConfig(blocks), PeerConfig{Listen: "127.0.0.1:0", AdvertiseHost: "127.0.0.1",
		Timeout: 500 * time.Millisecond, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(Config{Peer: p}, eng, nil)
	if err != nil {
		eng.Close()
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		w.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w, eng, p
}

type genOut struct {
	toks  []kv.Token
	usage engine.Usage
}

func genEngine(t *testing.T, e engine.Engine, req *engine.Request) genOut {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ch, err := e.Generate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var out genOut
	for c := range ch {
		if c.Err != nil {
			t.Fatal(c.Err)
		}
		out.toks = append(out.toks, c.Tokens...)
		if c.Usage != nil {
			out.usage = *c.Usage
		}
	}
	return out
}

func seqHashes(toks []kv.Token) []kv.SeqHash {
	_, seq := kv.NewHasher(peerBS, "", "").Blocks(toks)
	return seq
}

// simHint is the router's hint to fetch the blocks seq from the sim serving
// ep: it names them by that sim's engine hashes.
func simHint(id, ep string, seq []kv.SeqHash) *kv.Hint {
	h := &kv.Hint{ID: id, Endpoint: ep}
	for _, s := range seq {
		h.Hashes = append(h.Hashes, sim.EngineHash(s))
	}
	return h
}

func turnReq(id string, toks []kv.Token, hint *kv.Hint) *engine.Request {
	return &engine.Request{ID: id, Tokens: toks, Sampling: kv.Sampling{MaxTokens: 8, Seed: 42}, KVHint: hint}
}

// reference is what a cold engine produces for req (no hint, no cache).
func reference(t *testing.T, req *engine.Request) genOut {
	t.Helper()
	e, err := sim.New(peerSimConfig(1024))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	r := *req
	r.KVHint = nil
	return genEngine(t, e, &r)
}

// waitServed waits for the source side's served-blocks metric to reach
// want: the source records a transfer after its last write, so the target
// may finish first.
func waitServed(t *testing.T, reg *prometheus.Registry, want int) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, "the served-blocks metric to reach "+strconv.Itoa(want), func() bool {
		return testutil.Value(t, reg, "kvmesh_transfer_blocks_total", "operation", "serve") == float64(want)
	})
}

// A target fetches a conversation's prefix from the peer that computed it:
// same answer as a cold engine, the fetched payloads byte-identical to the
// source's, the prefix counted as cached, the transfer in the metrics.
func TestPeerFetchWholePrefix(t *testing.T) {
	reg := prometheus.NewRegistry()
	pm, err := NewPeerMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	_, a, pa := servingPeer(t, 1024, pm)
	_, b, pb := servingPeer(t, 1024, pm)

	turn1 := prompt(5, 40*peerBS+3)
	genEngine(t, a, turn1Req(turn1))
	turn2 := append(slices.Clone(turn1), prompt(9000, 5*peerBS)...)
	hinted := seqHashes(turn1)
	hint := simHint("sel-1", pa.Endpoints()[0], hinted)

	got := genEngine(t, b, turnReq("t2", turn2, hint))
	want := reference(t, turnReq("t2", turn2, nil))
	if !slices.Equal(got.toks, want.toks) {
		t.Fatalf("hinted answer %v, cold answer %v", got.toks, want.toks)
	}
	if got.usage.CachedTokens != len(hinted)*peerBS {
		t.Errorf("cached tokens %d, want the %d fetched", got.usage.CachedTokens, len(hinted)*peerBS)
	}
	if s := pb.Stats(); s.Fetched != 1 || s.Blocks != uint64(len(hinted)) || s.Bytes != uint64(len(hinted)*3*40) {
		t.Errorf("target stats %+v", s)
	}
	// The target's copy of every hinted block equals the source's, layer by
	// layer (and both equal the payload derivation: Insert verified it).
	ba, bb := make([]byte, 40), make([]byte, 40)
	for _, h := range hinted {
		for l := range 3 {
			if _, err := a.ReadPayload(kv.SeqHash(h), l, ba); err != nil {
				t.Fatal(err)
			}
			if _, err := b.ReadPayload(kv.SeqHash(h), l, bb); err != nil {
				t.Fatalf("block %016x not in the target: %v", h, err)
			}
			if kv.Checksum(ba) != kv.Checksum(bb) || !bytes.Equal(ba, bb) {
				t.Fatalf("block %016x layer %d differs", h, l)
			}
		}
	}
	if c := b.Counters(); c.FetchedBlocks != uint64(len(hinted)) || c.FetchErrors != 0 {
		t.Errorf("engine counters %+v", c)
	}
	if v := testutil.Value(t, reg, "kvmesh_transfer_blocks_total", "operation", "fetch"); v != float64(len(hinted)) {
		t.Errorf("fetch blocks metric %v, want %d", v, len(hinted))
	}
	waitServed(t, reg, len(hinted))
	if v := testutil.Value(t, reg, "kvmesh_transfer_duration_seconds_count", "scope", "fetch", "result", "success"); v != 1 {
		t.Errorf("fetch successes %v, want 1", v)
	}
	if v := testutil.Value(t, reg, "kvmesh_kv_hint_results_total", "result", HintFetched); v != 1 {
		t.Errorf("fetched hints %v, want 1", v)
	}

	// The same hint with a new turn: the hinted blocks are local now, so
	// the hint is unused and nothing moves.
	turn3 := append(slices.Clone(turn1), prompt(20000, 2*peerBS)...)
	genEngine(t, b, turnReq("t3", turn3, hint))
	if s := pb.Stats(); s.Unused != 1 || s.Fetched != 1 || s.Blocks != uint64(len(hinted)) {
		t.Errorf("re-hinted stats %+v", s)
	}
	// And A, which holds turn 1, answers turn 2 the same way.
	if ga := genEngine(t, a, turnReq("t2a", turn2, nil)); !slices.Equal(ga.toks, got.toks) {
		t.Errorf("source answers %v, target %v", ga.toks, got.toks)
	}
}

func turn1Req(toks []kv.Token) *engine.Request {
	return &engine.Request{ID: "t1", Tokens: toks, Sampling: kv.Sampling{MaxTokens: 4, Seed: 7}}
}

// The peer evicted the tail of the prefix: the target inserts the prefix the
// peer still has, recomputes the rest, and answers correctly.
func TestPeerFetchPartialAfterEviction(t *testing.T) {
	_, a, pa := servingPeer(t, 32, nil)
	_, b, pb := servingPeer(t, 1024, nil)
	turn1 := prompt(5, 20*peerBS)
	genEngine(t, a, turn1Req(turn1))
	hinted := seqHashes(turn1)
	// An unrelated prompt needs more blocks than are free: the least
	// recently freed (the conversation's tail) are evicted.
	genEngine(t, a, &engine.Request{ID: "q", Tokens: prompt(50000, 16*peerBS), Sampling: kv.Sampling{MaxTokens: 2}})
	held := a.Lookup(hinted)
	if held == 0 || held >= len(hinted) {
		t.Fatalf("peer holds %d of %d blocks; want a strict prefix", held, len(hinted))
	}
	turn2 := append(slices.Clone(turn1), prompt(9000, 3*peerBS)...)
	req := turnReq("t2", turn2, simHint("sel-2", pa.Endpoints()[0], hinted))
	got := genEngine(t, b, req)
	if want := reference(t, req); !slices.Equal(got.toks, want.toks) {
		t.Fatalf("answer %v, want %v", got.toks, want.toks)
	}
	if got.usage.CachedTokens != held*peerBS {
		t.Errorf("cached %d tokens, want the %d blocks the peer still held", got.usage.CachedTokens, held)
	}
	if s := pb.Stats(); s.Partial != 1 || s.Blocks != uint64(held) {
		t.Errorf("stats %+v, want one partial of %d blocks", s, held)
	}
}

// The peer is gone (its control endpoint closed): the fetch fails at once
// as unreachable and the request is computed locally.
func TestPeerFetchDeadSource(t *testing.T) {
	reg := prometheus.NewRegistry()
	pm, err := NewPeerMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	wa, a, pa := servingPeer(t, 1024, pm)
	_, b, pb := servingPeer(t, 1024, pm)
	turn1 := prompt(5, 12*peerBS)
	genEngine(t, a, turn1Req(turn1))
	ep := pa.Endpoints()[0]
	if err := wa.Close(); err != nil {
		t.Fatal(err)
	}
	turn2 := append(slices.Clone(turn1), prompt(9000, peerBS)...)
	req := turnReq("t2", turn2, simHint("sel-3", ep, seqHashes(turn1)))
	got := genEngine(t, b, req)
	if want := reference(t, req); !slices.Equal(got.toks, want.toks) {
		t.Fatalf("answer %v, want %v", got.toks, want.toks)
	}
	if got.usage.CachedTokens != 0 {
		t.Errorf("cached %d tokens from a dead peer", got.usage.CachedTokens)
	}
	if s := pb.Stats(); s.Fallback != 1 {
		t.Errorf("stats %+v, want one fallback", s)
	}
	if v := testutil.Value(t, reg, "kvmesh_transfer_duration_seconds_count", "scope", "fetch", "result", "unreachable"); v != 1 {
		t.Errorf("unreachable fetches %v, want 1", v)
	}
	if c := b.Counters(); c.FetchErrors != 1 {
		t.Errorf("engine fetch errors %d, want 1", c.FetchErrors)
	}
}

// A source that accepts but never answers: the fetch times out (the
// operation timeout), nothing is inserted, the request succeeds.
func TestPeerFetchTimeout(t *testing.T) {
	reg := prometheus.NewRegistry()
	pm, err := NewPeerMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	eng, p, err := newSimPeer(peerSimConfig(1024), PeerConfig{Timeout: 150 * time.Millisecond, Metrics: pm})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	defer p.Close()
	toks := prompt(5, 6*peerBS)
	req := turnReq("t", toks, simHint("sel-4", "tcp://"+ln.Addr().String(), seqHashes(toks)))
	got := genEngine(t, eng, req)
	if want := reference(t, req); !slices.Equal(got.toks, want.toks) {
		t.Fatalf("answer %v, want %v", got.toks, want.toks)
	}
	if s := p.Stats(); s.Fallback != 1 {
		t.Errorf("stats %+v", s)
	}
	if v := testutil.Value(t, reg, "kvmesh_transfer_duration_seconds_count", "scope", "fetch", "result", "timeout"); v != 1 {
		t.Errorf("timed-out fetches %v, want 1", v)
	}
}

// Hints sent straight to a worker over gRPC, typed or as legacy JSON:
// malformed ones are counted where they enter and the request is computed
// locally with the right answer; an unknown protocol version is ignored; no
// kv.fetch action, or a hint naming the worker itself, is unused.
func TestPeerBadHintsOverGRPC(t *testing.T) {
	_, nc := startNATS(t)
	eng, p, err := newSimPeer(peerSimConfig(1024), PeerConfig{Listen: "127.0.0.1:0", AdvertiseHost: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	_, c := startWorkerWith(t, nc, eng, Config{Peer: p})
	self := p.Endpoints()[0]
	typed := func(ep string, n int) *api.KvFetchHint {
		h := &api.KvFetchHint{MessageId: "x", SourceControlEndpoint: ep}
		for i := range n {
			h.BlockHashes = append(h.BlockHashes, uint64(i+1))
		}
		return h
	}
	cases := []struct {
		name, hint string
		fetch      *api.KvFetchHint
		check      func(PeerStats) bool
	}{
		{"not json", `{"protocol_version":"0.1",`, nil, func(s PeerStats) bool { return s.Malformed == 1 }},
		{"negative hash", `{"protocol_version":"0.1","message_id":"x","actions":[{"action_id":"a1","action_type":"kv.fetch","action_version":"1.0","payload":{"source_control_endpoint":"tcp://127.0.0.1:1","block_hashes":[-1]}}]}`, nil,
			func(s PeerStats) bool { return s.Malformed == 2 }},
		{"wildcard source", `{"protocol_version":"0.1","message_id":"x","actions":[{"action_id":"a1","action_type":"kv.fetch","action_version":"1.0","payload":{"source_control_endpoint":"tcp://0.0.0.0:9","block_hashes":[1]}}]}`, nil,
			func(s PeerStats) bool { return s.Malformed == 3 }},
		{"unknown protocol", `{"protocol_version":"9.9","message_id":"x","actions":[]}`, nil, func(s PeerStats) bool { return s.Ignored == 1 && s.Malformed == 3 }},
		{"no fetch action", `{"protocol_version":"0.1","message_id":"x","actions":[{"action_id":"z","action_type":"kv.other","action_version":"1.0","payload":{}}]}`, nil,
			func(s PeerStats) bool { return s.Unused == 1 }},
		{"legacy, longer than the prompt", `{"protocol_version":"0.1","message_id":"x","actions":[{"action_id":"a1","action_type":"kv.fetch","action_version":"1.0","payload":{"source_control_endpoint":"tcp://127.0.0.1:1","block_hashes":[1,2,3,4,5,6]}}]}`, nil,
			func(s PeerStats) bool { return s.Malformed == 4 }},
		{"typed, wildcard source", "", typed("tcp://0.0.0.0:9", 1), func(s PeerStats) bool { return s.Malformed == 5 }},
		{"typed, no hashes", "", typed("tcp://127.0.0.1:1", 0), func(s PeerStats) bool { return s.Malformed == 6 }},
		{"typed, longer than the prompt", "", typed("tcp://127.0.0.1:1", 6), func(s PeerStats) bool { return s.Malformed == 7 }},
		{"typed, no endpoint", "", typed("", 1), func(s PeerStats) bool { return s.Malformed == 8 }},
		{"typed, from itself", "", typed(self, 5), func(s PeerStats) bool { return s.Unused == 2 && s.Malformed == 8 }},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i, tc := range cases {
		// A fresh prompt each time, so the engine has blocks to fetch.
		toks := prompt(1000*(i+1), 5*peerBS+1)
		want := reference(t, turnReq("r", toks, nil))
		st, err := c.Generate(ctx, &api.GenerateRequest{RequestId: tc.name, Tokens: toks, MaxTokens: 8, Seed: 42, KvHint: []byte(tc.hint), KvFetch: tc.fetch})
		if err != nil {
			t.Fatal(err)
		}
		var out []uint32
		for {
			ch, err := st.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if ch.Error != "" {
				t.Fatalf("%s: engine error %s", tc.name, ch.Error)
			}
			out = append(out, ch.Tokens...)
		}
		if !slices.Equal(out, want.toks) {
			t.Errorf("%s: answer %v, want %v", tc.name, out, want.toks)
		}
		if s := p.Stats(); !tc.check(s) {
			t.Errorf("case %d %s: stats %+v", i, tc.name, s)
		}
	}
}

// Advertisement: wildcard hosts are rejected with a precise error, IPv6 is
// bracketed, every DP rank gets an endpoint or the worker does not start,
// and an endpoint that does not reach this worker is never registered.
func TestControlEndpointAdvertisement(t *testing.T) {
	for _, host := range []string{"0.0.0.0", "::", "", "[::]"} {
		_, _, err := newSimPeer(peerSimConfig(64), PeerConfig{Listen: "0.0.0.0:0", AdvertiseHost: host})
		if err == nil {
			t.Errorf("advertise host %q accepted", host)
			continue
		}
		if host != "" && !errors.Is(err, errWildcard()) {
			t.Errorf("advertise host %q: %v, want the wildcard error", host, err)
		}
	}

	start := func(t *testing.T, dp int, pc PeerConfig, nc natsConn) (*Worker, error) {
		cfg := peerSimConfig(64)
		cfg.DPSize = dp
		eng, p, err := newSimPeer(cfg, pc)
		if err != nil {
			t.Fatal(err)
		}
		w, err := New(Config{Model: "adv", DPSize: dp, Peer: p, Discovery: discovery.Config{TTL: 2 * time.Second, Memory: true}}, eng, nc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Close() })
		return w, w.Start(context.Background())
	}

	t.Run("ipv6 bracketed", func(t *testing.T) {
		if ln, err := net.Listen("tcp", "[::1]:0"); err != nil {
			t.Skipf("no IPv6 loopback: %v", err)
		} else {
			ln.Close()
		}
		w, err := start(t, 1, PeerConfig{Listen: "[::1]:0", AdvertiseHost: "::1"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		eps := w.Instance().ControlEndpoints
		if len(eps) != 1 || !strings.HasPrefix(eps[0], "tcp://[::1]:") {
			t.Errorf("endpoints %v", eps)
		}
	})
	t.Run("hostname", func(t *testing.T) {
		w, err := start(t, 1, PeerConfig{Listen: "127.0.0.1:0", AdvertiseHost: "LocalHost"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if eps := w.Instance().ControlEndpoints; len(eps) != 1 || !strings.HasPrefix(eps[0], "tcp://localhost:") {
			t.Errorf("endpoints %v", eps)
		}
	})
	t.Run("every dp rank", func(t *testing.T) {
		w, err := start(t, 3, PeerConfig{Listen: "127.0.0.1:0", AdvertiseHost: "127.0.0.1"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		eps := w.Instance().ControlEndpoints
		if len(eps) != 3 || len(slices.Compact(slices.Sorted(slices.Values(eps)))) != 3 {
			t.Fatalf("endpoints %v, want 3 distinct", eps)
		}
	})
	t.Run("all or nothing", func(t *testing.T) {
		// Rank 1's port (port+1) is taken: nothing is served or registered.
		var ln, busy net.Listener
		for i := 0; i < 20 && busy == nil; i++ {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			port := l.Addr().(*net.TCPAddr).Port
			if b, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", itoa(port+1))); err == nil {
				ln, busy = l, b
			} else {
				l.Close()
			}
		}
		if busy == nil {
			t.Skip("no adjacent free ports")
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		defer busy.Close()
		_, nc := startNATS(t)
		w, err := start(t, 2, PeerConfig{Listen: net.JoinHostPort("127.0.0.1", itoa(port)), AdvertiseHost: "127.0.0.1"}, nc)
		if err == nil || !strings.Contains(err.Error(), "DP rank 1") {
			t.Fatalf("start: %v, want a DP rank 1 listen error", err)
		}
		if len(w.Instance().ControlEndpoints) != 0 {
			t.Errorf("endpoints recorded: %v", w.Instance().ControlEndpoints)
		}
		assertNotRegistered(t, nc, "adv")
		// Rank 0's port was released again.
		if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", itoa(port))); err != nil {
			t.Errorf("rank 0's port still bound: %v", err)
		} else {
			l.Close()
		}
	})
	t.Run("fault advertise", func(t *testing.T) {
		// KVMESH_FAULT_CONTROL_ADVERTISE: peers are sent to a forwarder
		// in front of the bound port, and the probe must come through it.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		bound := ln.Addr().String()
		ln.Close()
		fwd, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer fwd.Close()
		go func() {
			for {
				c, err := fwd.Accept()
				if err != nil {
					return
				}
				u, err := net.Dial("tcp", bound)
				if err != nil {
					c.Close()
					continue
				}
				go func() { io.Copy(u, c); u.Close() }()
				go func() { io.Copy(c, u); c.Close() }()
			}
		}()
		via := "tcp://" + fwd.Addr().String()
		w, err := start(t, 1, PeerConfig{Listen: bound, AdvertiseHost: "127.0.0.1", FaultAdvertise: []string{via}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if eps := w.Instance().ControlEndpoints; len(eps) != 1 || eps[0] != via {
			t.Errorf("endpoints %v, want [%s]", eps, via)
		}
		_, err = start(t, 1, PeerConfig{Listen: "127.0.0.1:0", AdvertiseHost: "127.0.0.1", FaultAdvertise: []string{"tcp://127.0.0.1:1"}, ProbeTimeout: time.Second}, nil)
		if err == nil || !strings.Contains(err.Error(), "not dialable") {
			t.Errorf("advertising a dead forwarder: %v, want not dialable", err)
		}
		if _, err := start(t, 2, PeerConfig{Listen: "127.0.0.1:0", AdvertiseHost: "127.0.0.1", FaultAdvertise: []string{via}}, nil); err == nil {
			t.Error("one fault endpoint for two DP ranks accepted")
		}
	})
	t.Run("undialable", func(t *testing.T) {
		// Bound on 127.0.0.1 but advertised as 127.0.0.2: peers could not
		// reach it, so the worker refuses to register.
		_, nc := startNATS(t)
		_, err := start(t, 1, PeerConfig{Listen: "127.0.0.1:0", AdvertiseHost: "127.0.0.2", ProbeTimeout: time.Second}, nc)
		if err == nil || !strings.Contains(err.Error(), "not dialable") || !strings.Contains(err.Error(), "tcp://127.0.0.2:") {
			t.Fatalf("start: %v, want an undialable error", err)
		}
		assertNotRegistered(t, nc, "adv")
	})
}

type natsConn = *nats.Conn

func errWildcard() error { return kv.ErrWildcardHost }

func itoa(n int) string { return strconv.Itoa(n) }

// assertNotRegistered checks that discovery holds no instance of model.
func assertNotRegistered(t *testing.T, nc *nats.Conn, model string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := memDiscovery(t, ctx, nc)
	w, err := d.Watch(ctx, model, func(discovery.Event) {})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	select {
	case <-w.Synced():
	case <-ctx.Done():
		t.Fatal("discovery watch never synced")
	}
	if in := w.Instances(); len(in) != 0 {
		t.Errorf("registered despite the failure: %+v", in)
	}
}

// newSimPeer starts a sim engine whose peer side is a new Peer of pc.
func newSimPeer(cfg sim.Config, pc PeerConfig) (*sim.Engine, *Peer, error) {
	return StartWithPeer(pc, func(p *Peer) (*sim.Engine, error) { return simpeer.New(cfg, p) })
}
