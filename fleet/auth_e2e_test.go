package fleet

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/transfer"
	"github.com/kvmesh/kvmesh/worker"
	"github.com/kvmesh/kvmesh/workerclient"
)

// With a fleet token a worker answers no worker API call and its control
// endpoint serves no block to a caller without the token; a cluster with
// the token routes to it as usual.
func TestFleetTokenGuardsWorker(t *testing.T) {
	_, nc, _ := controlPlane(t, 3*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const token = "fleet-secret"
	reg := prometheus.NewRegistry()
	cfg := sim.DefaultConfig()
	cfg.Model = hintedModel
	eng, p, err := newSimPeer(cfg, worker.PeerConfig{Listen: "127.0.0.1:0", AdvertiseHost: "127.0.0.1", Token: token})
	if err != nil {
		t.Fatal(err)
	}
	disc := discovery.Config{TTL: 3 * time.Second, Memory: true}
	w, err := worker.New(worker.Config{Peer: p, Discovery: disc, FleetToken: token, Registerer: reg,
		LoadInterval: time.Hour, Logger: slog.New(slog.DiscardHandler)}, eng, nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })

	// A caller without the token (or with another) gets Unauthenticated on
	// every call.
	for _, opts := range [][]grpc.DialOption{nil, {workerclient.WithFleetToken("wrong")}} {
		cc, err := grpc.NewClient("passthrough:///"+w.Addr(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		wc := api.NewWorkerClient(cc)
		st, err := wc.Generate(ctx, &api.GenerateRequest{RequestId: "x", Tokens: prompt(1, 64), MaxTokens: 4})
		if err == nil {
			_, err = st.Recv()
		}
		_, herr := wc.Health(ctx, &api.HealthRequest{})
		_, derr := wc.Dump(ctx, &api.DumpRequest{Worker: api.KeyToProto(kv.WorkerKey{Instance: w.InstanceID()})})
		for name, e := range map[string]error{"generate": err, "health": herr, "dump": derr} {
			if status.Code(e) != codes.Unauthenticated {
				t.Errorf("%s without the token: %v", name, e)
			}
		}
		cc.Close()
	}
	if v := testutil.Value(t, reg, "kvmesh_worker_unauthenticated_total"); v != 6 {
		t.Errorf("refusals counted %v, want 6", v)
	}

	// The control endpoint: nothing without the token.
	toks := prompt(2, 256)
	_, seq := kv.NewHasher(cfg.BlockSize, "", "").Blocks(toks)
	d, err := discovery.Open(ctx, nc, disc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(ctx, Config{NC: nc, Discovery: d, Models: []string{hintedModel}, FleetToken: token,
		Router: router.Config{Mode: router.ModeKV}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	waitFor(t, 10*time.Second, "cluster sees the worker", func() bool { return len(c.router.Workers(hintedModel, kv.RoleAggregated)) == 1 })
	if got := domainTurn(t, c, "", "", toks); len(got.toks) == 0 {
		t.Fatal("a cluster with the token got no tokens")
	}
	// Without the token (known from discovery) or with a wrong one (the
	// worker's Unauthenticated): a credentials error naming the flag.
	refusedCluster(t, ctx, nc, disc, Config{}, credToken, "requires the fleet token")
	refusedCluster(t, ctx, nc, disc, Config{FleetToken: "wrong"}, credToken, "refused this frontend's credentials")
	ask := make([]uint64, len(seq))
	for i, h := range seq {
		ask[i] = uint64(sim.EngineHash(h))
	}
	for _, tok := range []string{"", "wrong", token} {
		cl := transfer.NewClient(transfer.ClientOptions{Token: []byte(tok)})
		res, _ := cl.Fetch(ctx, p.Endpoints()[0], transfer.FetchRequest{Hashes: ask, Digest: p.Digest()})
		if want := map[bool]int{true: len(ask), false: 0}[tok == token]; res.Completed != want {
			t.Errorf("token %q: fetched %d blocks, want %d", tok, res.Completed, want)
		}
		res.Release()
		cl.Close()
	}
}

// With mutual TLS a worker's API and control endpoint talk only to peers
// holding a certificate of the fleet's CA; a cluster configured with one
// routes to it as usual.
func TestMutualTLSGuardsWorker(t *testing.T) {
	_, nc, _ := controlPlane(t, 3*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pki := testutil.NewFleetPKI(t, "fleet")
	other := testutil.NewFleetPKI(t, "intruder")
	cfg := sim.DefaultConfig()
	cfg.Model = hintedModel
	reg := prometheus.NewRegistry()
	pm, err := worker.NewPeerMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	eng, p, err := newSimPeer(cfg, worker.PeerConfig{Listen: "127.0.0.1:0", AdvertiseHost: "127.0.0.1",
		ServerTLS: pki.Server, ClientTLS: pki.Client, Metrics: pm})
	if err != nil {
		t.Fatal(err)
	}
	disc := discovery.Config{TTL: 3 * time.Second, Memory: true}
	w, err := worker.New(worker.Config{Peer: p, Discovery: disc, TLS: pki.Server, LoadInterval: time.Hour,
		Registerer: reg, Logger: slog.New(slog.DiscardHandler)}, eng, nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })

	for name, creds := range map[string]grpc.DialOption{
		"plaintext":  grpc.WithTransportCredentials(insecure.NewCredentials()),
		"another CA": grpc.WithTransportCredentials(credentials.NewTLS(other.Client)),
	} {
		cc, err := grpc.NewClient("passthrough:///"+w.Addr(), creds)
		if err != nil {
			t.Fatal(err)
		}
		hctx, hcancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = api.NewWorkerClient(cc).Health(hctx, &api.HealthRequest{})
		hcancel()
		if err == nil {
			t.Errorf("%s: the worker API answered", name)
		}
		cc.Close()
	}
	// Both were refused in the handshake and counted (gRPC may have
	// redialled within the call's deadline: at least one each). The server
	// counts when its side of the handshake ends, which may be after the
	// client gave up.
	testutil.WaitFor(t, 15*time.Second, "two TLS handshake refusals counted", func() bool {
		return testutil.Value(t, reg, "kvmesh_worker_tls_handshake_failures_total") >= 2
	})

	d, err := discovery.Open(ctx, nc, disc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(ctx, Config{NC: nc, Discovery: d, Models: []string{hintedModel}, TLS: pki.Client,
		Router: router.Config{Mode: router.ModeKV}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	waitFor(t, 10*time.Second, "cluster sees the worker", func() bool { return len(c.router.Workers(hintedModel, kv.RoleAggregated)) == 1 })
	toks := prompt(3, 256)
	if got := domainTurn(t, c, "", "", toks); len(got.toks) == 0 {
		t.Fatal("a cluster with the fleet's certificate got no tokens")
	}
	// Plaintext (known from discovery) or another CA (the handshake
	// fails): a credentials error naming the flags.
	refusedCluster(t, ctx, nc, disc, Config{}, credTLS, "requires the fleet's mutual TLS")
	refusedCluster(t, ctx, nc, disc, Config{TLS: other.Client}, credTLS, "refused this frontend's credentials")
	_, seq := kv.NewHasher(cfg.BlockSize, "", "").Blocks(toks)
	ask := make([]uint64, len(seq))
	for i, h := range seq {
		ask[i] = uint64(sim.EngineHash(h))
	}
	for name, opts := range map[string]transfer.ClientOptions{"fleet": {TLS: pki.Client}, "plaintext": {}, "another CA": {TLS: other.Client}} {
		cl := transfer.NewClient(opts)
		res, _ := cl.Fetch(ctx, p.Endpoints()[0], transfer.FetchRequest{Hashes: ask, Digest: p.Digest()})
		if want := map[bool]int{true: len(ask), false: 0}[name == "fleet"]; res.Completed != want {
			t.Errorf("%s: fetched %d blocks, want %d", name, res.Completed, want)
		}
		res.Release()
		cl.Close()
	}
	// The source counts after its side of the handshake fails, which may
	// be after the client gave up.
	waitFor(t, 15*time.Second, "the control endpoint counts 2 refusals (plaintext, another CA)", func() bool {
		return testutil.Value(t, reg, "kvmesh_transfer_refused_total", "reason", "unauthenticated") == 2
	})
}

// refusedCluster starts a cluster with cfg's credentials, which the only
// worker of hintedModel refuses: each request fails at once as a
// credentials error (never a lost worker, so never migrated) whose message
// says why and names the flags; the worker is not inhibited, the refusals
// are counted by credential and logged once.
func refusedCluster(t *testing.T, ctx context.Context, nc *nats.Conn, disc discovery.Config, cfg Config, cred, why string) {
	t.Helper()
	d, err := discovery.Open(ctx, nc, disc)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	var logs lockedBuffer
	cfg.NC, cfg.Discovery, cfg.Models, cfg.Registerer = nc, d, []string{hintedModel}, reg
	cfg.Router, cfg.Logger = router.Config{Mode: router.ModeKV}, slog.New(slog.NewTextHandler(&logs, nil))
	c, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitFor(t, 10*time.Second, "cluster sees the worker", func() bool { return len(c.router.Workers(hintedModel, kv.RoleAggregated)) == 1 })
	toks := prompt(9, 64)
	const n = 3
	for i := range n {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := generateErr(rctx, c, &kv.GenerateRequest{RequestID: "refused", Model: hintedModel, Tokens: toks, Sampling: kv.Sampling{MaxTokens: 4}})
		cancel()
		if !errors.Is(err, kv.ErrCredentials) || errors.Is(err, kv.ErrWorkerLost) {
			t.Fatalf("%s, request %d: %v, want a credentials error and no lost worker", cred, i, err)
		}
		if msg := err.Error(); !strings.Contains(msg, why) || !strings.Contains(msg, credFlags[cred]) {
			t.Fatalf("%s: %q does not say %q and name %s", cred, msg, why, credFlags[cred])
		}
	}
	if _, err := c.router.Peek(ctx, router.Request{Model: hintedModel, Tokens: toks}); err != nil {
		t.Errorf("%s: the worker was taken out of selection: %v", cred, err)
	}
	if v := testutil.Value(t, reg, "kvmesh_fleet_credential_refusals_total", "credential", cred); v != n {
		t.Errorf("%s: refusals counted %v, want %d", cred, v, n)
	}
	if got := strings.Count(logs.String(), "fleet credentials:"); got != 1 || !strings.Contains(logs.String(), credFlags[cred]) {
		t.Errorf("%s: logged %d times, want once naming %s:\n%s", cred, got, credFlags[cred], logs.String())
	}
}

// generateErr runs req and returns its error (nil: it completed).
func generateErr(ctx context.Context, c *Cluster, req *kv.GenerateRequest) error {
	st, err := c.Generate(ctx, req)
	if err != nil {
		return err
	}
	defer st.Close()
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

// lockedBuffer is a log sink safe for concurrent writers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
