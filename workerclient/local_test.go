package workerclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/discovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// fakeWorker answers by the request id; seen reports what the handler's
// context saw when it ended.
type fakeWorker struct {
	api.UnimplementedWorkerServer
	seen    chan string
	started chan struct{} // "wait" has its context
}

func (f *fakeWorker) Generate(req *api.GenerateRequest, st api.Worker_GenerateServer) error {
	ctx := st.Context()
	switch req.RequestId {
	case "stream":
		for i := range 3 {
			if err := st.Send(&api.GenerateChunk{Tokens: []uint32{uint32(i), uint32(i + 10)}}); err != nil {
				return err
			}
		}
		return st.Send(&api.GenerateChunk{Tokens: req.Tokens, FinishReason: "stop"})
	case "unavailable":
		if err := st.Send(&api.GenerateChunk{Tokens: []uint32{7}}); err != nil {
			return err
		}
		return status.Error(codes.Unavailable, "engine down")
	case "plain":
		return errors.New("boom")
	case "wrapped":
		return fmt.Errorf("outer: %w", status.Error(codes.InvalidArgument, "bad"))
	case "ctxerr":
		return context.DeadlineExceeded
	case "one":
		return st.Send(&api.GenerateChunk{Tokens: []uint32{uint32(len(req.Tokens))}, FinishReason: "stop"})
	case "early-eof":
		return nil
	case "metadata":
		md, _ := metadata.FromIncomingContext(ctx)
		_, dl := ctx.Deadline()
		return st.Send(&api.GenerateChunk{Error: strings.Join(md.Get("traceparent"), ",") + fmt.Sprintf(" deadline=%v", dl)})
	case "header-then-wait":
		if err := st.SendHeader(metadata.Pairs("ack", "1")); err != nil {
			return err
		}
		<-ctx.Done()
		f.seen <- status.FromContextError(ctx.Err()).Code().String()
		return ctx.Err()
	case "wait":
		f.started <- struct{}{}
		<-ctx.Done()
		f.seen <- status.FromContextError(ctx.Err()).Code().String()
		return ctx.Err()
	}
	return status.Errorf(codes.NotFound, "no case %q", req.RequestId)
}

func (f *fakeWorker) Health(ctx context.Context, _ *api.HealthRequest) (*api.HealthResponse, error) {
	return &api.HealthResponse{Ok: true, Model: "m", Running: 3}, nil
}

func (f *fakeWorker) Events(ctx context.Context, req *api.EventsRequest) (*api.EventsResponse, error) {
	return nil, status.Errorf(codes.NotFound, "events: not instance %x", req.Worker.GetInstance())
}

func (f *fakeWorker) Dump(context.Context, *api.DumpRequest) (*api.DumpResponse, error) {
	return nil, errors.New("dump broke")
}

// bothPaths runs fn against the fake over loopback gRPC and in process.
func bothPaths(t *testing.T, fn func(t *testing.T, wc api.WorkerClient, f *fakeWorker)) {
	t.Helper()
	for _, path := range []string{"grpc", "local"} {
		t.Run(path, func(t *testing.T) {
			f := &fakeWorker{seen: make(chan string, 1), started: make(chan struct{}, 1)}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := grpc.NewServer()
			api.RegisterWorkerServer(srv, f)
			go srv.Serve(ln)
			t.Cleanup(srv.Stop)
			pool := NewPool()
			t.Cleanup(pool.Close)
			in := discovery.Instance{ID: 42, GRPCAddr: ln.Addr().String()}
			if path == "local" {
				pool.AddLocal(Local{ID: in.ID, Addr: in.GRPCAddr, Service: f})
			}
			wc, err := pool.Get(in)
			if err != nil {
				t.Fatal(err)
			}
			if _, isLocal := wc.(localClient); isLocal != (path == "local") {
				t.Fatalf("pool gave %T on the %s path", wc, path)
			}
			fn(t, wc, f)
		})
	}
}

// drain reads a stream to its end: the chunks' tokens and the final error
// as "code: message" (EOF for a clean end).
func drain(st grpc.ServerStreamingClient[api.GenerateChunk]) ([][]uint32, string) {
	var got [][]uint32
	var m api.GenerateChunk // reused, as the fleet does
	for {
		if err := st.RecvMsg(&m); err != nil {
			if err == io.EOF {
				return got, "EOF"
			}
			s := status.Convert(err)
			return got, s.Code().String() + ": " + s.Message()
		}
		got = append(got, m.Tokens)
	}
}

func TestLocalStreamsAndErrorsAsGRPC(t *testing.T) {
	cases := []struct {
		id     string
		chunks int
		end    string
	}{
		{"stream", 4, "EOF"},
		{"unavailable", 1, "Unavailable: engine down"},
		{"plain", 0, "Unknown: boom"},
		{"wrapped", 0, "InvalidArgument: outer: rpc error: code = InvalidArgument desc = bad"},
		{"ctxerr", 0, "DeadlineExceeded: context deadline exceeded"},
		{"early-eof", 0, "EOF"},
		{"nope", 0, `NotFound: no case "nope"`},
	}
	bothPaths(t, func(t *testing.T, wc api.WorkerClient, _ *fakeWorker) {
		for _, c := range cases {
			st, err := wc.Generate(context.Background(), &api.GenerateRequest{RequestId: c.id, Tokens: []uint32{5, 6, 7}})
			if err != nil {
				t.Fatalf("%s: %v", c.id, err)
			}
			got, end := drain(st)
			if len(got) != c.chunks || end != c.end {
				t.Errorf("%s: %d chunks, end %q; want %d, %q", c.id, len(got), end, c.chunks, c.end)
			}
			if c.id == "stream" && fmt.Sprint(got) != "[[0 10] [1 11] [2 12] [5 6 7]]" {
				t.Errorf("stream: chunks %v", got)
			}
		}
	})
}

func TestLocalCarriesMetadataAndDeadline(t *testing.T) {
	bothPaths(t, func(t *testing.T, wc api.WorkerClient, _ *fakeWorker) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", "00-abc-def-01")
		st, err := wc.Generate(ctx, &api.GenerateRequest{RequestId: "metadata"})
		if err != nil {
			t.Fatal(err)
		}
		m, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if m.Error != "00-abc-def-01 deadline=true" {
			t.Errorf("worker saw %q", m.Error)
		}
	})
}

func TestLocalCancellationReachesWorker(t *testing.T) {
	for _, id := range []string{"wait", "header-then-wait"} {
		bothPaths(t, func(t *testing.T, wc api.WorkerClient, f *fakeWorker) {
			ctx, cancel := context.WithCancel(context.Background())
			st, err := wc.Generate(ctx, &api.GenerateRequest{RequestId: id})
			if err != nil {
				t.Fatal(err)
			}
			// Cancelled before the worker's handler runs, a gRPC call may
			// never reach it: cancel once it has.
			if id == "wait" {
				<-f.started
			}
			if id == "header-then-wait" {
				md, err := st.Header() // the worker's acknowledgement, before any chunk
				if err != nil || len(md.Get("ack")) != 1 {
					t.Fatalf("header %v, %v", md, err)
				}
			}
			cancel()
			if _, end := drain(st); end != "Canceled: context canceled" {
				t.Errorf("%s: the caller's stream ended %q", id, end)
			}
			if got := <-f.seen; got != "Canceled" {
				t.Errorf("%s: the worker's context ended %s", id, got)
			}
		})
	}
	bothPaths(t, func(t *testing.T, wc api.WorkerClient, _ *fakeWorker) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := wc.Health(ctx, &api.HealthRequest{}); status.Code(err) != codes.Canceled {
			t.Errorf("health under a cancelled context: %v", err)
		}
	})
}

func TestLocalUnaryAsGRPC(t *testing.T) {
	bothPaths(t, func(t *testing.T, wc api.WorkerClient, _ *fakeWorker) {
		h, err := wc.Health(context.Background(), &api.HealthRequest{})
		if err != nil || !h.Ok || h.Model != "m" || h.Running != 3 {
			t.Errorf("health %v, %v", h, err)
		}
		_, err = wc.Events(context.Background(), &api.EventsRequest{Worker: &api.WorkerKey{Instance: 9}, FromId: 1, ToId: 2})
		if s := status.Convert(err); s.Code() != codes.NotFound || s.Message() != "events: not instance 9" {
			t.Errorf("events: %v", err)
		}
		_, err = wc.Dump(context.Background(), &api.DumpRequest{})
		if s := status.Convert(err); s.Code() != codes.Unknown || s.Message() != "dump broke" {
			t.Errorf("dump: %v", err)
		}
	})
}

// A record naming another address than the local worker's is a remote
// instance (say a restarted worker elsewhere with the same id): gRPC.
func TestLocalOnlyAtItsAddress(t *testing.T) {
	pool := NewPool()
	defer pool.Close()
	pool.AddLocal(Local{ID: 1, Addr: "127.0.0.1:1", Service: &fakeWorker{}})
	if wc, _ := pool.Get(discovery.Instance{ID: 1, GRPCAddr: "127.0.0.1:1"}); fmt.Sprintf("%T", wc) != "workerclient.localClient" {
		t.Errorf("at its address: %T", wc)
	}
	if wc, _ := pool.Get(discovery.Instance{ID: 1, GRPCAddr: "127.0.0.1:2"}); fmt.Sprintf("%T", wc) == "workerclient.localClient" {
		t.Error("at another address: in process")
	}
	pool.Forget(1)
	if wc, _ := pool.Get(discovery.Instance{ID: 1, GRPCAddr: "127.0.0.1:1"}); fmt.Sprintf("%T", wc) != "workerclient.localClient" {
		t.Errorf("after Forget: %T", wc)
	}
}

// BenchmarkGenerateRoundTrip is one worker call of a 14k-token prompt
// answered by one chunk, as the fleet makes it, over loopback gRPC and in
// process: what reaching serve's own workers in process saves per request.
func BenchmarkGenerateRoundTrip(b *testing.B) {
	toks := make([]uint32, 14000)
	for i := range toks {
		toks[i] = uint32(i * 7919 % 200000)
	}
	for _, path := range []string{"grpc", "local"} {
		b.Run(path, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			f := &fakeWorker{}
			srv := grpc.NewServer(grpc.MaxRecvMsgSize(MaxMessageBytes))
			api.RegisterWorkerServer(srv, f)
			go srv.Serve(ln)
			defer srv.Stop()
			pool := NewPool()
			defer pool.Close()
			in := discovery.Instance{ID: 1, GRPCAddr: ln.Addr().String()}
			if path == "local" {
				pool.AddLocal(Local{ID: 1, Addr: in.GRPCAddr, Service: f})
			}
			wc, err := pool.Get(in)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			var m api.GenerateChunk
			for b.Loop() {
				st, err := wc.Generate(context.Background(), &api.GenerateRequest{RequestId: "one", Tokens: toks})
				if err != nil {
					b.Fatal(err)
				}
				if err := st.RecvMsg(&m); err != nil || len(m.Tokens) != 1 {
					b.Fatal(err, m.Tokens)
				}
				if err := st.RecvMsg(&m); err != io.EOF {
					b.Fatal(err)
				}
			}
		})
	}
}

// TryRecv hands out what the worker already sent, in order, and never
// waits: before the handler sent anything, and once it ended, it says no.
func TestLocalTryRecv(t *testing.T) {
	wc := LocalClient(&fakeWorker{})
	st, err := wc.Generate(context.Background(), &api.GenerateRequest{RequestId: "stream", Tokens: []uint32{5, 6, 7}})
	if err != nil {
		t.Fatal(err)
	}
	ls := st.(interface {
		TryRecv() (*api.GenerateChunk, bool)
	})
	<-st.(localClientStream).p.done // the handler sent its 4 chunks and returned
	var got [][]uint32
	for {
		m, ok := ls.TryRecv()
		if !ok {
			break
		}
		got = append(got, m.Tokens)
	}
	if fmt.Sprint(got) != "[[0 10] [1 11] [2 12] [5 6 7]]" {
		t.Fatalf("TryRecv handed out %v", got)
	}
	if _, err := st.Recv(); err != io.EOF {
		t.Fatalf("Recv after the last chunk: %v, want EOF", err)
	}
}

// relayWorker relays its messages instead of sending them: one sent
// first, then three through next, the last of them the end; "relay-fail"
// ends without a message and fails; "relay-wait" waits in next until the
// call's context ends.
type relayWorker struct {
	api.UnimplementedWorkerServer
	relayed chan bool // what Relay returned
	entered chan struct{}
}

func (f *relayWorker) Generate(req *api.GenerateRequest, st api.Worker_GenerateServer) error {
	r := st.(interface {
		Relay(func(bool) (*api.GenerateChunk, bool)) bool
	})
	if err := st.Send(&api.GenerateChunk{Tokens: []uint32{0}}); err != nil {
		return err
	}
	i := 0
	var err error
	ok := r.Relay(func(wait bool) (*api.GenerateChunk, bool) {
		switch req.RequestId {
		case "relay-fail":
			err = status.Error(codes.Unavailable, "engine down")
			return nil, true
		case "relay-wait":
			f.entered <- struct{}{}
			<-st.Context().Done()
			err = st.Context().Err()
			return nil, true
		}
		i++
		return &api.GenerateChunk{Tokens: []uint32{uint32(i)}, FinishReason: map[bool]string{true: "stop"}[i == 3]}, i == 3
	})
	f.relayed <- ok
	return err
}

// A relayed stream hands out what was sent before the relay, then next's
// messages in order (TryRecv too), then the handler's end; a caller that
// leaves while next waits releases the handler.
func TestLocalRelay(t *testing.T) {
	f := &relayWorker{relayed: make(chan bool, 1), entered: make(chan struct{}, 1)}
	wc := LocalClient(f)
	st, err := wc.Generate(context.Background(), &api.GenerateRequest{RequestId: "relay"})
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.Recv()
	if err != nil || fmt.Sprint(m.Tokens) != "[0]" {
		t.Fatalf("first: %v %v", m, err)
	}
	m, ok := st.(interface {
		TryRecv() (*api.GenerateChunk, bool)
	}).TryRecv()
	if !ok || fmt.Sprint(m.Tokens) != "[1]" {
		t.Fatalf("TryRecv: %v %v", m, ok)
	}
	got, end := drain(st)
	if fmt.Sprint(got) != "[[2] [3]]" || end != "EOF" || !<-f.relayed {
		t.Fatalf("relayed %v, end %q", got, end)
	}

	st, err = wc.Generate(context.Background(), &api.GenerateRequest{RequestId: "relay-fail"})
	if err != nil {
		t.Fatal(err)
	}
	if got, end := drain(st); len(got) != 1 || end != "Unavailable: engine down" || !<-f.relayed {
		t.Fatalf("failing relay: %v, end %q", got, end)
	}

	ctx, cancel := context.WithCancel(context.Background())
	st, err = wc.Generate(ctx, &api.GenerateRequest{RequestId: "relay-wait"})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		st.Recv()
		_, err := st.Recv()
		errc <- err
	}()
	<-f.entered
	cancel()
	if err := <-errc; status.Code(err) != codes.Canceled {
		t.Fatalf("a cancelled relay's Recv: %v", err)
	}
	if ended := <-f.relayed; !ended {
		t.Fatal("next ended the relay, yet Relay said the context did")
	}
}
