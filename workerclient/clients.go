package workerclient

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/kv"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// MaxMessageBytes bounds a worker API message (dumps of large caches).
const MaxMessageBytes = 256 << 20

// Pool keeps one gRPC connection per worker instance, redialled
// when the instance's address changes, or calls a worker of this process
// directly (AddLocal). Safe for concurrent use.
type Pool struct {
	mu     sync.Mutex
	conns  map[uint64]*workerConn
	closed bool
	opts   []grpc.DialOption
	local  map[uint64]localWorker // AddLocal's, by instance
}

type workerConn struct {
	addr string
	cc   *grpc.ClientConn
	wc   api.WorkerClient
}

// NewPool returns an empty pool; extra dial options are appended
// to the defaults (plaintext, 256 MiB messages).
func NewPool(opts ...grpc.DialOption) *Pool {
	base := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes)),
	}
	return &Pool{conns: map[uint64]*workerConn{}, opts: append(base, opts...)}
}

// Get returns a client for the instance, dialling lazily.
func (p *Pool) Get(in discovery.Instance) (api.WorkerClient, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("worker clients: closed")
	}
	if l, ok := p.local[in.ID]; ok && l.addr == in.GRPCAddr {
		return l.wc, nil
	}
	if c := p.conns[in.ID]; c != nil {
		if c.addr == in.GRPCAddr {
			return c.wc, nil
		}
		c.cc.Close()
		delete(p.conns, in.ID)
	}
	cc, err := grpc.NewClient("passthrough:///"+in.GRPCAddr, p.opts...)
	if err != nil {
		return nil, fmt.Errorf("worker %x at %s: %w", in.ID, in.GRPCAddr, err)
	}
	c := &workerConn{addr: in.GRPCAddr, cc: cc, wc: api.NewWorkerClient(cc)}
	p.conns[in.ID] = c
	return c.wc, nil
}

// Forget closes the connection to a departed instance.
func (p *Pool) Forget(id uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.conns[id]; c != nil {
		c.cc.Close()
		delete(p.conns, id)
	}
}

// Close closes every connection.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, c := range p.conns {
		c.cc.Close()
		delete(p.conns, id)
	}
	p.closed = true
}

// Repairer is the event feed's repairer (eventplane.Repairer) that asks
// workers over the worker API.
type Repairer struct{ Clients *Pool }

// Events fetches [from, to], following truncated answers; the answer is
// short (a prefix, maybe empty) when the worker's last id is below to.
func (r Repairer) Events(ctx context.Context, in discovery.Instance, w kv.WorkerKey, from, to uint64) ([]kv.Event, bool, error) {
	wc, err := r.Clients.Get(in)
	if err != nil {
		return nil, false, err
	}
	var out []kv.Event
	for from <= to {
		resp, err := wc.Events(ctx, &api.EventsRequest{Worker: api.KeyToProto(w), FromId: from, ToId: to})
		if err != nil {
			return nil, false, fmt.Errorf("events %v [%d,%d] from %s: %w", w, from, to, in.GRPCAddr, err)
		}
		if resp.TooOld {
			return nil, true, nil
		}
		if len(resp.Events) == 0 && resp.LastId < from {
			// The worker's ids end before the range: what it has is all
			// there is (the feed resets it from a dump).
			return out, false, nil
		}
		if len(resp.Events) == 0 {
			return nil, false, fmt.Errorf("events %v [%d,%d] from %s: empty answer (worker's last id %d)", w, from, to, in.GRPCAddr, resp.LastId)
		}
		evs, err := api.EventsFromProto(resp.Events)
		if err != nil {
			return nil, false, fmt.Errorf("events %v from %s: %w", w, in.GRPCAddr, err)
		}
		if evs[0].ID != from || evs[len(evs)-1].ID < from {
			return nil, false, fmt.Errorf("events %v from %s: answer starts at %d, asked %d", w, in.GRPCAddr, evs[0].ID, from)
		}
		out = append(out, evs...)
		from = evs[len(evs)-1].ID + 1
	}
	return out, false, nil
}

// Dump fetches a worker key's holdings.
func (r Repairer) Dump(ctx context.Context, in discovery.Instance, w kv.WorkerKey) ([]kv.Event, uint64, error) {
	wc, err := r.Clients.Get(in)
	if err != nil {
		return nil, 0, err
	}
	resp, err := wc.Dump(ctx, &api.DumpRequest{Worker: api.KeyToProto(w)})
	if err != nil {
		return nil, 0, fmt.Errorf("dump %v from %s: %w", w, in.GRPCAddr, err)
	}
	evs, err := api.EventsFromProto(resp.Events)
	if err != nil {
		return nil, 0, fmt.Errorf("dump %v from %s: %w", w, in.GRPCAddr, err)
	}
	return evs, resp.LastId, nil
}
