package fleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/engine/sim/simpeer"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/transfer"
	"github.com/kvmesh/kvmesh/worker"
)

const hintedModel = "hinted"

type hintedWorker struct {
	w    *worker.Worker
	eng  *sim.Engine
	peer *worker.Peer
}

func (h hintedWorker) key() kv.WorkerKey { return kv.WorkerKey{Instance: h.w.InstanceID()} }

type turnResult struct {
	toks   []uint32
	ttft   time.Duration
	cached int
}

func clusterTurn(t *testing.T, c *Cluster, toks []uint32) turnResult {
	t.Helper()
	return runTurn(t, c, &kv.GenerateRequest{RequestID: fmt.Sprint("r", time.Now().UnixNano()), Model: hintedModel,
		Tokens: toks, Sampling: kv.Sampling{MaxTokens: 6, Seed: 1234}})
}

// domainTurn is clusterTurn in the cache domain of a LoRA adapter and a
// cache salt ("": none).
func domainTurn(t *testing.T, c *Cluster, lora, salt string, toks []uint32) turnResult {
	t.Helper()
	return runTurn(t, c, &kv.GenerateRequest{RequestID: fmt.Sprint("r", time.Now().UnixNano()), Model: hintedModel,
		LoRA: lora, CacheSalt: salt, Tokens: toks, Sampling: kv.Sampling{MaxTokens: 4, Seed: 1234}})
}

// checkDomainShares: a domain's prompt, computed on a (n blocks of seq),
// is found cached there again, then on b through a hint from a.
func checkDomainShares(t *testing.T, c *Cluster, a, b hintedWorker, lora, salt string, toks []uint32, n int) {
	t.Helper()
	bs := sim.DefaultBlockSize
	c.router.UpdateLoad(a.key(), 0, 100, 0, 0)
	c.router.UpdateLoad(b.key(), 100, 100, 0, 0)
	if got := domainTurn(t, c, lora, salt, toks); got.cached < (n-1)*bs {
		t.Fatalf("%q/%q: the second request found %d cached tokens, want ≥ %d", lora, salt, got.cached, (n-1)*bs)
	}
	c.router.UpdateLoad(b.key(), 0, 100, 0, 0)
	c.router.UpdateLoad(a.key(), 100, 100, 0, 0)
	got := domainTurn(t, c, lora, salt, toks)
	if s := b.peer.Stats(); s.Fetched != 1 || got.cached < (n-1)*bs {
		t.Fatalf("%q/%q on B: %d cached tokens, peer stats %+v; want a fetched hint", lora, salt, got.cached, s)
	}
}

// checkServesNoOtherDomain: a, asked for seq's blocks by their exact
// engine hashes in any of domains, serves none.
func checkServesNoOtherDomain(t *testing.T, ctx context.Context, a hintedWorker, seq []kv.SeqHash, domains ...uint64) {
	t.Helper()
	cl := transfer.NewClient(transfer.ClientOptions{})
	defer cl.Close()
	ask := make([]uint64, len(seq))
	for i, h := range seq {
		ask[i] = uint64(sim.EngineHash(h))
	}
	for _, dom := range domains {
		res, _ := cl.Fetch(ctx, a.peer.Endpoints()[0], transfer.FetchRequest{Hashes: ask, Digest: a.peer.Digest(), Domain: dom})
		if res.Completed != 0 {
			t.Fatalf("A served %d of the blocks to domain %x", res.Completed, dom)
		}
		res.Release()
	}
}

// runTurn streams req through c: its tokens, time to first token and
// cached prompt tokens.
func runTurn(t *testing.T, c *Cluster, req *kv.GenerateRequest) turnResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	st, err := c.Generate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var r turnResult
	for {
		ch, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(ch.Tokens) > 0 && r.ttft == 0 {
			r.ttft = time.Since(start)
		}
		r.toks = append(r.toks, ch.Tokens...)
		r.cached = max(r.cached, ch.CachedTokens)
		if ch.Finish != "" {
			break
		}
	}
	return r
}

// startHintedWorkers starts n sim workers of hintedModel that serve their
// caches to each other on loopback control endpoints; tune adjusts each
// one's sim config and wc is the worker config (Peer and Discovery are set
// here).
func startHintedWorkers(t *testing.T, ctx context.Context, nc *nats.Conn, disc discovery.Config, pm *worker.PeerMetrics,
	n int, tune func(*sim.Config), wc worker.Config) []hintedWorker {
	t.Helper()
	var ws []hintedWorker
	for range n {
		cfg := sim.DefaultConfig()
		cfg.Model = hintedModel
		if tune != nil {
			tune(&cfg)
		}
		eng, p, err := newSimPeer(cfg, worker.PeerConfig{Listen: "127.0.0.1:0", AdvertiseHost: "127.0.0.1", Metrics: pm})
		if err != nil {
			t.Fatal(err)
		}
		c := wc
		c.Peer, c.Discovery = p, disc
		w, err := worker.New(c, eng, nc)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Close() })
		ws = append(ws, hintedWorker{w, eng, p})
	}
	return ws
}

// hintedFleet is a control plane with hinted workers on it, for clusters
// to route over.
type hintedFleet struct {
	ctx context.Context // ends with the test
	nc  *nats.Conn
	d   *discovery.Discovery
	reg *prometheus.Registry // the peers' metrics; a cluster's if given it
	ws  []hintedWorker
}

// startHintedFleet starts the control plane and n hinted workers on it
// (tune and wc as for startHintedWorkers), with peer metrics in reg.
func startHintedFleet(t *testing.T, n int, tune func(*sim.Config), wc worker.Config) *hintedFleet {
	t.Helper()
	_, nc, _ := controlPlane(t, 3*time.Second)
	f := &hintedFleet{nc: nc, reg: prometheus.NewRegistry()}
	pm, err := worker.NewPeerMetrics(f.reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f.ctx = ctx
	disc := discovery.Config{TTL: 3 * time.Second, Memory: true}
	f.ws = startHintedWorkers(t, ctx, nc, disc, pm, n, tune, wc)
	if f.d, err = discovery.Open(ctx, nc, disc); err != nil {
		t.Fatal(err)
	}
	return f
}

// cluster opens a KV-mode cluster of hintedModel over the fleet with rc
// (Mode set here), its series in r (nil: none), and waits until it sees
// every worker hint-capable.
func (f *hintedFleet) cluster(t *testing.T, rc router.Config, r prometheus.Registerer) *Cluster {
	t.Helper()
	rc.Mode = router.ModeKV
	c, err := New(f.ctx, Config{NC: f.nc, Discovery: f.d, Models: []string{hintedModel}, Registerer: r, Router: rc,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	waitHintCapable(t, c, len(f.ws))
	return c
}

// waitHintCapable waits until c sees n hint-capable workers of hintedModel.
func waitHintCapable(t *testing.T, c *Cluster, n int) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("cluster sees %d hint-capable workers", n), func() bool {
		infos := c.router.Workers(hintedModel, kv.RoleAggregated)
		return len(infos) == n && !slices.ContainsFunc(infos, func(i router.WorkerInfo) bool { return !i.HintCapable })
	})
}

// The serve path end to end, in one process: embedded NATS, four sim
// workers that serve their caches on loopback control endpoints, and the
// frontend's Cluster with hint planning on. A conversation's first turn is
// computed on worker A; A is then reported full (the router's busy
// threshold), so the second turn goes to a cold worker B, and the router's
// planner names A as B's source. B fetches the prefix from A: its answer
// equals A's, the payloads are A's byte for byte, its TTFT beats a cold
// worker recomputing the same turn with hints off, and the transfer shows
// in the metrics.
func TestHintedConversationAcrossWorkers(t *testing.T) {
	f := startHintedFleet(t, 4, func(cfg *sim.Config) {
		// Prefill dominates: modelled time runs at half speed, and a fetched
		// block is priced as a real 8B model's (64 tokens × 128 KiB) at the
		// default 64 GB/s, on top of the real loopback transfer time.
		cfg.SpeedupRatio = 0.5
		cfg.TransferBytesPerBlock = 64 * 128 << 10
	}, worker.Config{LoadInterval: time.Hour})
	ws, reg := f.ws, f.reg
	// The hinted cluster's per-worker series go in reg.
	hinted := f.cluster(t, router.Config{Hints: true, MaxKVUsage: 0.9}, reg)
	plain := f.cluster(t, router.Config{MaxKVUsage: 0.9}, nil)

	turn1 := prompt(100, 6000)
	turn2 := append(slices.Clone(turn1), prompt(90000, 250)...)
	local, seq := kv.NewHasher(sim.DefaultBlockSize, "", "").Blocks(turn1)
	n1 := len(seq)

	clusterTurn(t, hinted, turn1)
	ai := slices.IndexFunc(ws, func(h hintedWorker) bool { return h.eng.Lookup(seq) == n1 })
	if ai < 0 {
		t.Fatal("no worker holds turn 1")
	}
	a := ws[ai]
	// Both routers learn A's blocks from its events, then see A as full.
	for _, c := range []*Cluster{hinted, plain} {
		waitFor(t, 10*time.Second, "index holds turn 1 on A", func() bool {
			for _, m := range c.index.FindMatches(local, nil) {
				if m.Worker == a.key() && int(m.Depth[kv.TierDevice]) == n1 {
					return true
				}
			}
			return false
		})
		c.router.UpdateLoad(a.key(), 100, 100, 0, 0)
	}

	got := clusterTurn(t, hinted, turn2)
	bi := slices.IndexFunc(ws, func(h hintedWorker) bool { return h.peer.Stats().Fetched == 1 })
	if bi < 0 || bi == ai {
		t.Fatalf("no worker but A fetched: stats %+v %+v %+v %+v", ws[0].peer.Stats(), ws[1].peer.Stats(), ws[2].peer.Stats(), ws[3].peer.Stats())
	}
	b := ws[bi]
	if s := b.peer.Stats(); s.Blocks != uint64(n1) {
		t.Errorf("B inserted %d blocks, want %d", s.Blocks, n1)
	}
	if got.cached != n1*sim.DefaultBlockSize {
		t.Errorf("B reports %d cached tokens, want %d", got.cached, n1*sim.DefaultBlockSize)
	}
	// The fleet's actual hits by tier: B's cached prompt came from a peer.
	actual := func(tier string) float64 {
		return testutil.Value(t, reg, "kvmesh_fleet_worker_cached_prompt_tokens_by_tier_total",
			"instance", natsbus.InstanceToken(b.w.InstanceID()), "tier", tier)
	}
	if p, dev := actual("peer"), actual("device"); p != float64(n1*sim.DefaultBlockSize) || dev != 0 {
		t.Errorf("B's actual hits: peer %v, device %v; want peer %d, device 0", p, dev, n1*sim.DefaultBlockSize)
	}
	// Every fetched block is A's, byte for byte.
	pa, pb := make([]byte, sim.DefaultPayloadSize), make([]byte, sim.DefaultPayloadSize)
	for _, h := range seq {
		for l := range sim.DefaultLayers {
			if _, err := a.eng.ReadPayload(h, l, pa); err != nil {
				t.Fatal(err)
			}
			if _, err := b.eng.ReadPayload(h, l, pb); err != nil {
				t.Fatal(err)
			}
			if kv.Checksum(pa) != kv.Checksum(pb) || !bytes.Equal(pa, pb) {
				t.Fatalf("block %016x layer %d differs between A and B", h, l)
			}
		}
	}

	// The same turn with hints off goes to a cold worker and recomputes.
	waitFor(t, 10*time.Second, "plain index holds turn 2 on B", func() bool {
		for _, m := range plain.index.FindMatches(local, nil) {
			if m.Worker == b.key() && int(m.Depth[kv.TierDevice]) == n1 {
				return true
			}
		}
		return false
	})
	plain.router.UpdateLoad(b.key(), 100, 100, 0, 0)
	base := clusterTurn(t, plain, turn2)
	if base.cached != 0 {
		t.Fatalf("baseline found %d cached tokens; it must recompute", base.cached)
	}
	if !slices.Equal(got.toks, base.toks) {
		t.Fatalf("hinted answer %v, recomputed answer %v", got.toks, base.toks)
	}
	// A, which computed turn 1, gives the same answer.
	ga := generateOn(t, a.eng, &engine.Request{ID: "on-a", Tokens: turn2, Sampling: kv.Sampling{MaxTokens: 6, Seed: 1234}})
	if !slices.Equal(ga.toks, got.toks) {
		t.Errorf("A answers %v, B %v", ga.toks, got.toks)
	}

	t.Logf("turn 2 TTFT: hinted fetch %v, recompute %v (%.1fx); %d blocks fetched", got.ttft, base.ttft,
		float64(base.ttft)/float64(got.ttft), n1)
	if got.ttft >= base.ttft {
		t.Errorf("hinted TTFT %v is not below recompute TTFT %v", got.ttft, base.ttft)
	}
	if v := gatherMetrics(t, reg)[`kvmesh_transfer_blocks_total{operation="fetch"}`]; v != float64(n1) {
		t.Errorf("kvmesh_transfer_blocks_total{operation=\"fetch\"} = %v, want %d", v, n1)
	}
	// The source records a transfer after its last write, so the target may
	// finish first.
	waitFor(t, 10*time.Second, "the served-blocks metric", func() bool {
		return gatherMetrics(t, reg)[`kvmesh_transfer_blocks_total{operation="serve"}`] == float64(n1)
	})
	if v := gatherMetrics(t, reg)[`kvmesh_kv_hint_results_total{result="`+worker.HintFetched+`"}`]; v != 1 {
		t.Errorf("fetched hints %v, want 1", v)
	}
}

// generateOn runs req on eng directly and returns its tokens.
func generateOn(t *testing.T, eng engine.Engine, req *engine.Request) turnResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ch, err := eng.Generate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var r turnResult
	for c := range ch {
		if c.Err != nil {
			t.Fatal(c.Err)
		}
		r.toks = append(r.toks, c.Tokens...)
	}
	return r
}

// newSimPeer starts a sim engine whose peer side is a new worker.Peer of pc.
func newSimPeer(cfg sim.Config, pc worker.PeerConfig) (*sim.Engine, *worker.Peer, error) {
	return worker.StartWithPeer(pc, func(p *worker.Peer) (*sim.Engine, error) { return simpeer.New(cfg, p) })
}
