package workerclient

import (
	"context"
	"errors"
	"io"
	"sync"

	"github.com/kvmesh/kvmesh/api"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Local is a worker that runs in the caller's own process (kvmesh serve):
// a Pool reaches it by calling its service directly, without protobuf
// encoding, HTTP/2 framing or a fleet proof (the caller is the process
// that started it). Everything else a caller sees is what the gRPC path
// gives: the same interface, status errors with the same codes and
// messages, cancellation and deadlines carried to the worker's context,
// the outgoing metadata (trace context) as the worker's incoming metadata,
// and response headers as the worker's acknowledgement.
//
// Messages are shared, not copied: a caller must not modify a request
// after sending it, nor the worker a chunk after sending it.
type Local struct {
	ID   uint64 // the worker's instance
	Addr string // the address it advertises; a record naming another is reached over gRPC
	// Service is the worker's own API implementation.
	Service api.WorkerServer
}

// localBuffer is how many chunks a worker may send ahead of its caller, as
// gRPC's flow-control window lets it.
const localBuffer = 64

// AddLocal makes the pool reach l's instance in process while discovery
// lists it at l.Addr. Forget leaves it in place: a worker that leaves and
// rejoins discovery is still this process's.
func (p *Pool) AddLocal(l Local) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.local == nil {
		p.local = map[uint64]localWorker{}
	}
	p.local[l.ID] = localWorker{addr: l.Addr, wc: LocalClient(l.Service)}
}

type localWorker struct {
	addr string
	wc   api.WorkerClient
}

// LocalClient is an api.WorkerClient that calls srv in process (see Local).
func LocalClient(srv api.WorkerServer) api.WorkerClient { return localClient{srv} }

type localClient struct{ srv api.WorkerServer }

// serverContext is what a gRPC server gives its handler for a call made
// under ctx: the caller's cancellation, deadline and outgoing metadata
// (as incoming), but none of its values.
func serverContext(ctx context.Context) (context.Context, context.CancelFunc) {
	sctx, cancel := context.WithCancel(context.Background())
	if dl, ok := ctx.Deadline(); ok {
		var c2 context.CancelFunc
		sctx, c2 = context.WithDeadline(sctx, dl)
		c1 := cancel
		cancel = func() { c2(); c1() }
	}
	stop := context.AfterFunc(ctx, cancel)
	if md, ok := metadata.FromOutgoingContext(ctx); ok {
		sctx = metadata.NewIncomingContext(sctx, md.Copy())
	}
	return sctx, func() { stop(); cancel() }
}

// statusError is err as a gRPC client receives a handler's error: a
// status error as it is, a context error as its code, anything else
// Unknown with its text.
func statusError(err error) error {
	if err == nil {
		return nil
	}
	if s, ok := status.FromError(err); ok {
		return s.Err()
	}
	return status.FromContextError(err).Err()
}

// unary calls h as a gRPC client would: a call whose context is already
// done never reaches the worker.
func unary[Req, Resp any](ctx context.Context, in *Req, h func(context.Context, *Req) (*Resp, error)) (*Resp, error) {
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	sctx, cancel := serverContext(ctx)
	defer cancel()
	out, err := h(sctx, in)
	if err != nil {
		return nil, statusError(err)
	}
	return out, nil
}

func (c localClient) Events(ctx context.Context, in *api.EventsRequest, _ ...grpc.CallOption) (*api.EventsResponse, error) {
	return unary(ctx, in, c.srv.Events)
}

func (c localClient) Dump(ctx context.Context, in *api.DumpRequest, _ ...grpc.CallOption) (*api.DumpResponse, error) {
	return unary(ctx, in, c.srv.Dump)
}

func (c localClient) Health(ctx context.Context, in *api.HealthRequest, _ ...grpc.CallOption) (*api.HealthResponse, error) {
	return unary(ctx, in, c.srv.Health)
}

// Generate runs the worker's handler on its own goroutine, as a gRPC
// server would, and returns the stream its chunks arrive on.
func (c localClient) Generate(ctx context.Context, in *api.GenerateRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[api.GenerateChunk], error) {
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	sctx, cancel := serverContext(ctx)
	p := &localPipe{cctx: ctx, sctx: sctx, msgs: make(chan *api.GenerateChunk, localBuffer),
		headerSent: make(chan struct{}), done: make(chan struct{}), relayed: make(chan struct{}), relayEnd: make(chan struct{})}
	go func() {
		err := c.srv.Generate(in, localServerStream{p})
		p.mu.Lock()
		p.err = statusError(err)
		p.mu.Unlock()
		p.sendHeader()
		close(p.done)
		cancel() // the call is over: the handler's context ends, as gRPC's does
	}()
	return localClientStream{p}, nil
}

// localPipe joins one Generate call's handler to its caller.
type localPipe struct {
	cctx, sctx context.Context
	msgs       chan *api.GenerateChunk
	headerSent chan struct{}
	headerOnce sync.Once
	done       chan struct{} // closed once the handler returned and err is set

	mu      sync.Mutex
	header  metadata.MD
	trailer metadata.MD
	err     error

	// A relay (localServerStream.Relay): the caller runs next itself.
	relayed  chan struct{} // closed once next is set
	relayEnd chan struct{} // closed once next said the stream ended
	relayMu  sync.Mutex    // held while next runs
	next     func(wait bool) (*api.GenerateChunk, bool)
	ended    bool // next said end, or the handler left
}

// pull runs the relay's next under relayMu; ok: m is a message. Not ok:
// none was ready (wait false), or the relay is over and the handler's
// own end (done, err) follows.
func (p *localPipe) pull(wait bool) (m *api.GenerateChunk, ok bool) {
	p.relayMu.Lock()
	defer p.relayMu.Unlock()
	if p.ended {
		return nil, false
	}
	m, end := p.next(wait)
	if end {
		p.ended = true
		close(p.relayEnd)
	}
	return m, m != nil
}

// end is how the stream ends for its caller once the handler has no more
// messages: its error, EOF, or the caller's own cancellation.
func (p *localPipe) end() (*api.GenerateChunk, error) {
	select {
	case <-p.done:
		select { // what the handler sent before it returned comes first
		case m := <-p.msgs:
			return m, nil
		default:
		}
		p.mu.Lock()
		err := p.err
		p.mu.Unlock()
		if err == nil {
			return nil, io.EOF
		}
		return nil, err
	case <-p.cctx.Done():
		return nil, status.FromContextError(p.cctx.Err()).Err()
	}
}

func (p *localPipe) sendHeader() { p.headerOnce.Do(func() { close(p.headerSent) }) }

var errHeaderSent = errors.New("workerclient: local stream's header already sent")

// localServerStream is the handler's side (grpc.ServerStreamingServer).
type localServerStream struct{ p *localPipe }

func (s localServerStream) Context() context.Context { return s.p.sctx }

func (s localServerStream) SetHeader(md metadata.MD) error {
	select {
	case <-s.p.headerSent:
		return errHeaderSent
	default:
	}
	s.p.mu.Lock()
	s.p.header = metadata.Join(s.p.header, md)
	s.p.mu.Unlock()
	return nil
}

func (s localServerStream) SendHeader(md metadata.MD) error {
	if err := s.SetHeader(md); err != nil {
		return err
	}
	s.p.sendHeader()
	return nil
}

func (s localServerStream) SetTrailer(md metadata.MD) {
	s.p.mu.Lock()
	s.p.trailer = metadata.Join(s.p.trailer, md)
	s.p.mu.Unlock()
}

func (s localServerStream) Send(m *api.GenerateChunk) error {
	s.p.sendHeader() // gRPC sends the headers with the first message
	select {
	case s.p.msgs <- m:
		return nil
	case <-s.p.sctx.Done():
		return status.FromContextError(s.p.sctx.Err()).Err()
	}
}

func (s localServerStream) SendMsg(m any) error {
	c, ok := m.(*api.GenerateChunk)
	if !ok {
		return status.Errorf(codes.Internal, "workerclient: local stream sends GenerateChunk, not %T", m)
	}
	return s.Send(c)
}

// Relay hands the rest of the stream to the caller instead of sending it:
// the caller's Recv (and TryRecv) call next in the caller's goroutine,
// with wait false for TryRecv, until next says end (m, if not nil, is the
// last message). One goroutine switch less per message than Send. It
// sends the header (the worker has the request) and returns once next
// said end (true), or once the call's context ended first (false), never
// while next runs: next must itself return when that context ends.
func (s localServerStream) Relay(next func(wait bool) (m *api.GenerateChunk, end bool)) bool {
	p := s.p
	p.sendHeader()
	p.relayMu.Lock()
	p.next = next
	p.relayMu.Unlock()
	close(p.relayed)
	select {
	case <-p.relayEnd:
		return true
	case <-p.sctx.Done():
		p.relayMu.Lock()
		defer p.relayMu.Unlock()
		if p.ended {
			return true
		}
		p.ended = true
		return false
	}
}

// RecvMsg: the one request went to the handler as its argument.
func (s localServerStream) RecvMsg(any) error { return io.EOF }

// localClientStream is the caller's side (grpc.ServerStreamingClient).
type localClientStream struct{ p *localPipe }

func (s localClientStream) Recv() (*api.GenerateChunk, error) {
	p := s.p
	for {
		select { // what the handler sent before a relay comes first
		case m := <-p.msgs:
			return m, nil
		default:
		}
		select {
		case <-p.relayed:
			if m, ok := p.pull(true); ok {
				return m, nil
			}
			return p.end()
		default:
		}
		select {
		case m := <-p.msgs:
			return m, nil
		case <-p.relayed:
			continue
		case <-p.done:
			return p.end()
		case <-p.cctx.Done():
			return nil, status.FromContextError(p.cctx.Err()).Err()
		}
	}
}

// TryRecv is Recv when a chunk is already waiting (ok); otherwise it
// returns at once with ok false, whatever the stream's state: a caller
// that wants the end or an error calls Recv. It lets a relay write every
// chunk that is ready before it flushes, without a goroutine of its own
// to find out whether one is.
func (s localClientStream) TryRecv() (m *api.GenerateChunk, ok bool) {
	select {
	case m := <-s.p.msgs:
		return m, true
	default:
	}
	select {
	case <-s.p.relayed:
		return s.p.pull(false)
	default:
		return nil, false
	}
}

// RecvMsg fills m (a *api.GenerateChunk the caller may reuse) with the
// next chunk.
func (s localClientStream) RecvMsg(m any) error {
	c, err := s.Recv()
	if err != nil {
		return err
	}
	dst, ok := m.(proto.Message)
	if !ok {
		return status.Errorf(codes.Internal, "workerclient: local stream receives into a proto message, not %T", m)
	}
	proto.Reset(dst)
	proto.Merge(dst, c)
	return nil
}

func (s localClientStream) Header() (metadata.MD, error) {
	select {
	case <-s.p.headerSent:
	case <-s.p.cctx.Done():
		return nil, status.FromContextError(s.p.cctx.Err()).Err()
	}
	s.p.mu.Lock()
	defer s.p.mu.Unlock()
	return s.p.header, nil
}

func (s localClientStream) Trailer() metadata.MD {
	select {
	case <-s.p.done:
	default:
		return nil // gRPC's is only known once the stream ended
	}
	s.p.mu.Lock()
	defer s.p.mu.Unlock()
	return s.p.trailer
}

func (s localClientStream) CloseSend() error         { return nil }
func (s localClientStream) Context() context.Context { return s.p.cctx }
func (s localClientStream) SendMsg(any) error {
	return errors.New("workerclient: Generate sends its one request at the call")
}
