package fleet

import (
	"context"
	"errors"
	"io"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
)

// rejectingStream is a worker's gRPC stream that fails its first message.
type rejectingStream struct {
	grpc.ClientStream
	err error
}

func (s *rejectingStream) Recv() (*api.GenerateChunk, error) { return nil, s.err }
func (s *rejectingStream) RecvMsg(any) error                 { return s.err }

// A worker's InvalidArgument is kv.ErrRejected (a 400, never migrated), not a
// lost worker; the worker stays routable.
func TestWorkerInvalidArgumentIsRejected(t *testing.T) {
	r, err := router.New(router.Config{Mode: router.ModeRoundRobin})
	if err != nil {
		t.Fatal(err)
	}
	k := kv.WorkerKey{Instance: 1}
	if err := r.AddWorker(router.WorkerInfo{Key: k, Model: "m", BlockSize: 16}); err != nil {
		t.Fatal(err)
	}
	route := func() (*router.Decision, error) {
		return r.Route(context.Background(), router.Request{Model: "m", Tokens: make([]uint32, 40)})
	}
	d, err := route()
	if err != nil {
		t.Fatal(err)
	}
	ws := &workerStream{d: d, ctx: context.Background(), cancel: func() {},
		st: &rejectingStream{err: status.Error(codes.InvalidArgument, "generate: need 9 KV blocks, the engine has 8")}}
	_, err = ws.Recv()
	if !errors.Is(err, kv.ErrRejected) || errors.Is(err, kv.ErrWorkerLost) || err.Error() != "the worker rejected the request: generate: need 9 KV blocks, the engine has 8" {
		t.Fatalf("got %v, want kv.ErrRejected with the worker's message", err)
	}
	if l := r.Load(k); l.ActiveRequests != 0 {
		t.Fatalf("the rejected request still books load: %+v", l)
	}
	if _, err := route(); err != nil {
		t.Fatalf("a worker that rejected a bad request was taken out of routing: %v", err)
	}
}

// A stream that breaks (here the worker ends it without a finish reason)
// is a lost worker: kv.ErrWorkerLost, and the router leaves the worker out.
func TestWorkerLostIsInhibited(t *testing.T) {
	r, err := router.New(router.Config{Mode: router.ModeRoundRobin})
	if err != nil {
		t.Fatal(err)
	}
	k := kv.WorkerKey{Instance: 1}
	if err := r.AddWorker(router.WorkerInfo{Key: k, Model: "m", BlockSize: 16}); err != nil {
		t.Fatal(err)
	}
	d, err := r.Route(context.Background(), router.Request{Model: "m", Tokens: make([]uint32, 40)})
	if err != nil {
		t.Fatal(err)
	}
	ws := &workerStream{d: d, ctx: context.Background(), cancel: func() {}, st: &rejectingStream{err: io.EOF}}
	if _, err := ws.Recv(); !errors.Is(err, kv.ErrWorkerLost) {
		t.Fatalf("got %v, want kv.ErrWorkerLost", err)
	}
	if _, err := r.Route(context.Background(), router.Request{Model: "m", Tokens: make([]uint32, 40)}); !errors.Is(err, kv.ErrNoWorkers) {
		t.Fatalf("the lost worker is still routable: %v", err)
	}
}
