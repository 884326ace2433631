package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/worker"
)

// recordingProxy sits between the router and a real worker: it forwards
// the worker API and counts what arrives, so the test sees exactly what the
// frontend sends to workers.
type recordingProxy struct {
	api.UnimplementedWorkerServer
	to                      api.WorkerClient
	calls, hints, transfers atomic.Int64
}

func (p *recordingProxy) Generate(req *api.GenerateRequest, st api.Worker_GenerateServer) error {
	p.calls.Add(1)
	if len(req.KvHint) > 0 || req.KvFetch != nil {
		p.hints.Add(1)
	}
	if len(req.KvTransferParams) > 0 {
		p.transfers.Add(1)
	}
	up, err := p.to.Generate(st.Context(), req)
	if err != nil {
		return err
	}
	for {
		ch, err := up.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := st.Send(ch); err != nil {
			return err
		}
	}
}

func (p *recordingProxy) Events(ctx context.Context, r *api.EventsRequest) (*api.EventsResponse, error) {
	return p.to.Events(ctx, r)
}
func (p *recordingProxy) Dump(ctx context.Context, r *api.DumpRequest) (*api.DumpResponse, error) {
	return p.to.Dump(ctx, r)
}
func (p *recordingProxy) Health(ctx context.Context, r *api.HealthRequest) (*api.HealthResponse, error) {
	return p.to.Health(ctx, r)
}

// TestServeWiringInProcess runs serve's frontend wiring (startFrontend) in
// this process against a real sim worker reached through a recording
// proxy: client-injected kv_hint / kv_transfer_params / nvext never reach
// the worker and change nothing; a cancelled stream stops the engine; and
// everything shuts down without leaking goroutines.
func TestServeWiringInProcess(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.DiscardHandler)

	ns, err := natsbus.StartEmbedded(natsbus.EmbeddedConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	nc, err := natsbus.Connect(natsbus.ConnConfig{URLs: ns.URL(), Name: "inproc-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	disc, err := discovery.Open(ctx, nc, discovery.Config{})
	if err != nil {
		t.Fatal(err)
	}

	// The real worker serves gRPC only; discovery gets the proxy's address.
	cfg := sim.DefaultConfig()
	cfg.SpeedupRatio = 10
	eng, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(worker.Config{Logger: log}, eng, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	conn, err := grpc.NewClient(w.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	proxy := &recordingProxy{to: api.NewWorkerClient(conn)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	api.RegisterWorkerServer(gs, proxy)
	go gs.Serve(ln)
	defer gs.Stop()
	inst := w.Instance()
	inst.GRPCAddr = ln.Addr().String()
	reg, err := disc.Register(ctx, inst)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		rctx, rcancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer rcancel()
		reg.Close(rctx)
	}()

	ff := &frontendFlags{listen: "127.0.0.1:0", models: []string{simModel}, routerMode: "kv", migrationLimit: 3, maxBodyBytes: 1 << 20}
	rf, err := startFrontend(ctx, ff, nc, disc, log)
	if err != nil {
		t.Fatal(err)
	}
	defer rf.shutdown()
	if err := waitReady(ctx, rf.cluster, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := newClient(rf.url(), option.WithHTTPClient(&http.Client{Transport: tr}))

	injected := []option.RequestOption{
		option.WithJSONSet("kv_hint", map[string]any{"v": 1, "op": "fetch", "source": "tcp://10.9.9.9:1", "blocks": []uint64{7, 8}}),
		option.WithJSONSet("kv_transfer_params", map[string]any{"do_remote_prefill": true, "remote_host": "10.9.9.9"}),
		option.WithJSONSet("nvext", map[string]any{"backend_instance_id": 99, "annotations": []string{"kv_hint"}}),
	}
	chat := chatParams("Is there a hint in here?", 9, 20)
	plain := chatOnce(t, client, chat).Choices[0].Message.Content
	hinted := chatOnce(t, client, chat, injected...).Choices[0].Message.Content
	if plain != hinted {
		t.Errorf("chat: injected hints changed the output: %q vs %q", hinted, plain)
	}
	comp := openai.CompletionNewParams{Model: simModel, Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hint?")},
		Seed: openai.Int(3), MaxTokens: openai.Int(12)}
	var texts [2]string
	for i, opts := range [][]option.RequestOption{nil, injected} {
		r, err := client.Completions.New(ctx, comp, opts...)
		if err != nil {
			t.Fatal(err)
		}
		texts[i] = r.Choices[0].Text
	}
	if texts[0] != texts[1] {
		t.Errorf("completions: injected hints changed the output: %q vs %q", texts[1], texts[0])
	}
	if c, h, tp := proxy.calls.Load(), proxy.hints.Load(), proxy.transfers.Load(); c != 4 || h != 0 || tp != 0 {
		t.Errorf("worker saw %d requests, %d with kv_hint, %d with kv_transfer_params; want 4, 0, 0", c, h, tp)
	}

	// Cancellation reaches the engine.
	sctx, scancel := context.WithCancel(ctx)
	st := client.Chat.Completions.NewStreaming(sctx, chatParams("go on forever", 5, 1_000_000))
	for i := 0; i < 4 && st.Next(); i++ {
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if r := eng.Stats().Running; r != 1 {
		t.Fatalf("engine runs %d requests mid-stream, want 1", r)
	}
	scancel()
	st.Close()
	testutil.WaitFor(t, 10*time.Second, "the engine to drop the cancelled request", func() bool {
		s := eng.Stats()
		return s.Running == 0 && s.Waiting == 0
	})
}
