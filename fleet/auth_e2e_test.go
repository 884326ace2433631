package fleet

import (
	"context"
	"log/slog"
	"testing"
	"time"

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
	eng, p, err := worker.NewSimPeer(cfg, worker.PeerConfig{Listen: "127.0.0.1:0", AdvertiseHost: "127.0.0.1", Token: token})
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
	if got := saltedTurn(t, c, "", toks); len(got.toks) == 0 {
		t.Fatal("a cluster with the token got no tokens")
	}
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
	eng, p, err := worker.NewSimPeer(cfg, worker.PeerConfig{Listen: "127.0.0.1:0", AdvertiseHost: "127.0.0.1",
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
	testutil.WaitFor(t, 5*time.Second, "two TLS handshake refusals counted", func() bool {
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
	if got := saltedTurn(t, c, "", toks); len(got.toks) == 0 {
		t.Fatal("a cluster with the fleet's certificate got no tokens")
	}
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
	waitFor(t, 5*time.Second, "the control endpoint counts 2 refusals (plaintext, another CA)", func() bool {
		return testutil.Value(t, reg, "kvmesh_transfer_refused_total", "reason", "unauthenticated") == 2
	})
}
