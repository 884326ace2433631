package frontend

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/router"
)

// rejectingStream is a worker's gRPC stream that fails its first message.
type rejectingStream struct {
	grpc.ClientStream
	err error
}

func (s *rejectingStream) Recv() (*api.GenerateChunk, error) { return nil, s.err }
func (s *rejectingStream) RecvMsg(any) error                 { return s.err }

// A worker's InvalidArgument is ErrRejected (a 400, never migrated), not a
// lost worker; the worker stays routable.
func TestWorkerInvalidArgumentIsRejected(t *testing.T) {
	c := &Cluster{}
	ws := &workerStream{c: c, d: &router.Decision{}, ctx: context.Background(), cancel: func() {},
		st: &rejectingStream{err: status.Error(codes.InvalidArgument, "generate: need 9 KV blocks, the engine has 8")}}
	_, err := ws.Recv()
	if !errors.Is(err, ErrRejected) || errors.Is(err, ErrWorkerLost) || err.Error() != "the worker rejected the request: generate: need 9 KV blocks, the engine has 8" {
		t.Fatalf("got %v, want ErrRejected with the worker's message", err)
	}
	if c.inhibited != nil {
		t.Fatal("a worker that rejected a bad request was taken out of routing")
	}
}

// MaxContext is the smallest device KV capacity among the model's workers.
func TestClusterMaxContext(t *testing.T) {
	c := &Cluster{instances: map[uint64]discovery.Instance{
		1: {ID: 1, Model: "m", BlockSize: 16, KVCapacity: map[string]int{"device": 100, "host": 5000}},
		2: {ID: 2, Model: "m", BlockSize: 16, KVCapacity: map[string]int{"device": 80}},
		3: {ID: 3, Model: "m", BlockSize: 16}, // no capacity reported: no bound
		4: {ID: 4, Model: "other", BlockSize: 16, KVCapacity: map[string]int{"device": 1}},
	}}
	if got := c.MaxContext("m"); got != 80*16 {
		t.Fatalf("MaxContext(m) = %d, want %d", got, 80*16)
	}
	if got := c.MaxContext("none"); got != 0 {
		t.Fatalf("MaxContext of an unserved model = %d, want 0", got)
	}
}
