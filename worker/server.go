package worker

import (
	"context"
	"errors"
	"slices"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/internal/stages"
	"github.com/kvmesh/kvmesh/kv"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errEngineDown ends streams on a worker whose engine fails its health
// check; Unavailable makes the frontend migrate them.
var errEngineDown = status.Error(codes.Unavailable, "generate: engine unhealthy (its health check fails); retry on another worker")

// errStalled ends streams on a worker whose engine stalled; Unavailable
// makes the frontend migrate the request to another worker.
var errStalled = status.Error(codes.Unavailable, "generate: engine stalled (no output within the stall timeout); worker out of service, retry on another worker")

// server implements api.WorkerServer for one Worker.
type server struct {
	api.UnimplementedWorkerServer
	w *Worker
}

func (s *server) Generate(req *api.GenerateRequest, stream api.Worker_GenerateServer) error {
	w := s.w
	stream, end := s.startSpan(req, stream)
	result, err := s.generate(req, stream)
	end(result, err)
	w.met.requests.WithLabelValues(result).Inc()
	return err
}

// generate serves one stream and says how it ended (the metrics' result).
func (s *server) generate(req *api.GenerateRequest, stream api.Worker_GenerateServer) (result string, err error) {
	w := s.w
	clk := w.stages.Start()
	var t *hintTicket
	if req.KvFetch != nil || len(req.KvHint) > 0 {
		w.hints.Add(1)
		t = &hintTicket{outcomes: w.met.hintOutcomes}
		defer func() { w.settleHint(t, result) }()
		// Acknowledged at once: the fleet holds back a hinted stream's
		// cancellation until the worker has it (or a timeout), so the
		// hint is counted here rather than lost in flight.
		_ = stream.SendHeader(nil)
	}
	switch {
	case len(req.Tokens) == 0:
		return resultRejected, status.Error(codes.InvalidArgument, "generate: empty prompt")
	case int(req.DpRank) >= w.cfg.DPSize:
		return resultRejected, status.Errorf(codes.InvalidArgument, "generate: dp_rank %d but dp_size %d", req.DpRank, w.cfg.DPSize)
	case req.Lora != "" && !slices.Contains(w.cfg.LoRAs, req.Lora):
		return resultRejected, status.Errorf(codes.InvalidArgument, "generate: lora %q is not served by this worker (it serves %v)", req.Lora, w.cfg.LoRAs)
	}
	smp, err := api.SamplingFromProto(req)
	if err != nil {
		return resultRejected, status.Errorf(codes.InvalidArgument, "generate: %v", err)
	}
	if len(req.KvTransferParams) > 0 {
		w.transferParams.Add(1)
	}
	la, err := admitLeg(req)
	if err != nil {
		return resultRejected, status.Errorf(codes.InvalidArgument, "generate: %v", err)
	}
	if la.paramsDrop {
		w.foreignParams.Add(1)
	}
	var hint *kv.Hint
	if req.KvFetch != nil || len(req.KvHint) > 0 {
		if la.dropHint {
			// Applied once, on the leg that computed the prompt.
			w.decodeHints.Add(1)
			if t.end(outcomeDropped, reasonDecodeLeg) && w.cfg.Peer != nil {
				w.cfg.Peer.count(HintUnused)
			}
		} else {
			// A bad hint only costs the fetch, never the request.
			hint = w.admitHint(req, t)
		}
	}
	if la.leg != kv.LegWhole {
		w.log.Debug("disagg leg", "request", req.RequestId, "leg", la.leg.String(), "hint", hint != nil,
			"params", paramsDigest(la.params), "params_stripped", la.paramsStrip)
	}
	ereq := &engine.Request{
		ID: req.RequestId, Tokens: req.Tokens, Sampling: smp, LoRA: req.Lora, CacheSalt: req.CacheSalt,
		KVHint: hint, DPRank: int(req.DpRank), Leg: la.leg, TransferParams: la.params,
	}
	// Counted (as waiting on the engine) before the engine sees it, so an
	// engine that hangs on admission still trips the watchdog.
	wd := w.wd
	wd.inflight.Add(1)
	defer wd.inflight.Add(-1)
	if wd.stalled.Load() {
		return resultUnavailable, errStalled
	}
	healthy, down := w.engineHealth()
	if !healthy {
		return resultUnavailable, errEngineDown
	}
	// The stream's context ends when the client cancels or disconnects;
	// the engine stops working on the request with it.
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	ctx = withHintTicket(ctx, t)
	clk.Mark(stages.WorkerAdmit)
	ctx = stages.With(ctx, clk) // an adapter marks its request's build and connect
	ch, err := startGenerate(ctx, w.eng, ereq, wd.stallCh)
	switch {
	case err == errStalled:
		return resultUnavailable, errStalled
	case ctx.Err() != nil:
		return resultCanceled, err
	}
	if errors.Is(err, engine.ErrClosed) {
		return resultUnavailable, status.Error(codes.Unavailable, "generate: worker shutting down")
	}
	if errors.Is(err, engine.ErrUnavailable) {
		return resultUnavailable, status.Errorf(codes.Unavailable, "generate: %v", err)
	}
	if err != nil {
		return resultRejected, status.Errorf(codes.InvalidArgument, "generate: %v", err)
	}
	if hint != nil && w.cfg.Peer == nil {
		// An engine without a fetcher reports no use: the hint is
		// delivered once the engine accepted the request it was lowered into.
		t.end(outcomeDelivered, reasonLowered)
	}
	w.met.inflight.Inc()
	defer w.met.inflight.Dec()
	o := &outputs{w: w, req: req, ctx: ctx, ch: ch, down: down, clk: clk}
	if r, ok := relayOf(stream); ok {
		// A caller in process takes each output from the engine in its
		// own goroutine: no hand-off through this one per chunk. While
		// the caller is away (writing to its client) the stream is not
		// waiting on the engine, as when a Send blocks.
		wd.inflight.Add(-1)
		ended := r.Relay(o.pull)
		wd.inflight.Add(1)
		if ended {
			return o.result, o.err
		}
		return resultCanceled, status.FromContextError(ctx.Err()).Err()
	}
	for {
		out, c, result, err := o.next(true)
		if out == nil {
			return result, err
		}
		// A stream blocked on a slow caller is not waiting on the
		// engine, so it must not count toward a stall.
		wd.inflight.Add(-1)
		err = stream.Send(out)
		wd.inflight.Add(1)
		if err != nil {
			return resultCanceled, err
		}
		if result, end := o.sent(c); end {
			return result, nil
		}
	}
}

// relayer is a stream whose caller runs in this process and can take the
// handler's outputs itself (workerclient's local stream): Relay hands it
// next, and returns once next said the stream ended (true) or the call's
// context ended first (false), never while the caller is inside next.
type relayer interface {
	Relay(next func(wait bool) (m *api.GenerateChunk, end bool)) bool
}

func relayOf(s api.Worker_GenerateServer) (relayer, bool) {
	if t, ok := s.(tracedStream); ok {
		s = t.Worker_GenerateServer
	}
	r, ok := s.(relayer)
	return r, ok
}

// outputs turns one request's engine chunks into the stream's messages.
type outputs struct {
	w    *Worker
	req  *api.GenerateRequest
	ctx  context.Context
	ch   <-chan engine.Chunk
	down <-chan struct{}
	clk  *stages.Clock
	held engine.Chunk // taken from ch while coalescing, not yet sent
	hold bool
	// How a relayed stream ended (pull said end).
	result string
	err    error
}

// next is the next message and the chunk it carries; out nil: the stream
// ended with result and err, or (result "") nothing was ready and wait
// was false.
func (o *outputs) next(wait bool) (out *api.GenerateChunk, c engine.Chunk, result string, err error) {
	w, wd := o.w, o.w.wd
	var ok bool
	if o.hold {
		c, ok, o.hold = o.held, true, false
	} else if wait {
		select {
		case <-o.ctx.Done():
			return nil, c, resultCanceled, status.FromContextError(o.ctx.Err()).Err()
		case <-wd.stallCh:
			return nil, c, resultUnavailable, errStalled
		case <-o.down:
			return nil, c, resultUnavailable, errEngineDown
		case c, ok = <-o.ch:
		}
	} else {
		select {
		case c, ok = <-o.ch:
		default:
			return nil, c, "", nil
		}
	}
	if !ok {
		return nil, c, resultAborted, nil
	}
	wd.outputs.Add(1)
	if plainTokens(c) {
		// Tokens the engine already queued behind this one go in the
		// same message: one hand-off (and one wake-up of the caller)
		// for the lot. Nothing is waited for.
		c.Tokens, o.held, o.hold = takeQueued(o.ch, c.Tokens)
	}
	o.clk.Mark(stages.EngineFirst) // observed for the first output only
	out = &api.GenerateChunk{Tokens: c.Tokens, FinishReason: string(c.Finish), KvTransferParams: c.TransferParams}
	if len(c.TransferParams) > 0 {
		w.log.Debug("disagg prefill answered", "request", o.req.RequestId, "params", paramsDigest(c.TransferParams))
	}
	if c.Usage != nil {
		out.Usage = api.UsageToProto(c.Usage.PromptTokens, c.Usage.CompletionTokens, c.Usage.ByTier())
	}
	if errors.Is(c.Err, engine.ErrUnavailable) {
		// The engine failed under the request: the stream ends
		// Unavailable so the caller migrates what it has.
		return nil, c, resultUnavailable, status.Errorf(codes.Unavailable, "generate: %v", c.Err)
	}
	if c.Err != nil {
		out.Error = c.Err.Error()
		if out.FinishReason == "" {
			out.FinishReason = string(kv.FinishError)
		}
	}
	return out, c, "", nil
}

// sent accounts for c once its message reached the caller; end: it was
// the stream's last, which ended with result.
func (o *outputs) sent(c engine.Chunk) (result string, end bool) {
	w := o.w
	w.met.output.Add(float64(len(c.Tokens)))
	if c.Err != nil {
		return resultError, true
	}
	if c.Finish != kv.FinishNone {
		if u := c.Usage; u != nil {
			w.met.prompt.Add(float64(u.PromptTokens))
			w.met.cached.Add(float64(u.CachedTokens))
			w.met.addTiers(u)
		}
		return resultFinished, true
	}
	return "", false
}

// pull is next for a relayed stream, run by the caller: the message is
// sent once it is returned. Inside it the stream waits on the engine.
func (o *outputs) pull(wait bool) (*api.GenerateChunk, bool) {
	wd := o.w.wd
	wd.inflight.Add(1)
	defer wd.inflight.Add(-1)
	out, c, result, err := o.next(wait)
	if out == nil {
		if result == "" {
			return nil, false
		}
		o.result, o.err = result, err
		return nil, true
	}
	if result, end := o.sent(c); end {
		o.result = result
		return out, true
	}
	return out, false
}

// plainTokens: c carries tokens and nothing else, so it may be joined
// with the tokens that follow it.
func plainTokens(c engine.Chunk) bool {
	return len(c.Tokens) > 0 && c.Finish == kv.FinishNone && c.Err == nil && c.Usage == nil && len(c.TransferParams) == 0
}

// takeQueued appends to toks the tokens of the plain chunks already queued
// on ch, without waiting. The first other chunk it meets is returned as
// held (ok); a closed channel stops it (the next receive sees it closed).
// toks is copied before it grows: the engine's slice is not ours to extend.
func takeQueued(ch <-chan engine.Chunk, toks []kv.Token) (out []kv.Token, held engine.Chunk, ok bool) {
	out = toks
	for {
		select {
		case c, open := <-ch:
			if !open {
				return out, engine.Chunk{}, false
			}
			if !plainTokens(c) {
				return out, c, true
			}
			if len(out) == len(toks) {
				out = append(make([]kv.Token, 0, 2*(len(toks)+len(c.Tokens))), toks...)
			}
			out = append(out, c.Tokens...)
		default:
			return out, engine.Chunk{}, false
		}
	}
}

func (s *server) Events(_ context.Context, req *api.EventsRequest) (*api.EventsResponse, error) {
	if req.Worker.GetInstance() != s.w.cfg.InstanceID {
		return nil, status.Errorf(codes.NotFound, "events: this is instance %x, not %x", s.w.cfg.InstanceID, req.Worker.GetInstance())
	}
	if req.FromId == 0 || req.FromId > req.ToId {
		return nil, status.Errorf(codes.InvalidArgument, "events: bad range [%d,%d]", req.FromId, req.ToId)
	}
	return s.w.evlog.EventsAnswer(req), nil
}

func (s *server) Dump(_ context.Context, req *api.DumpRequest) (*api.DumpResponse, error) {
	if req.Worker.GetInstance() != s.w.cfg.InstanceID {
		return nil, status.Errorf(codes.NotFound, "dump: this is instance %x, not %x", s.w.cfg.InstanceID, req.Worker.GetInstance())
	}
	return s.w.evlog.DumpAnswer(req), nil
}

func (s *server) Health(context.Context, *api.HealthRequest) (*api.HealthResponse, error) {
	st := s.w.eng.Stats()
	return &api.HealthResponse{Ok: !s.w.wd.stalled.Load() && !s.w.engineDown.Load(), Instance: s.w.cfg.InstanceID, Model: s.w.cfg.Model,
		Running: uint32(st.Running), Waiting: uint32(st.Waiting)}, nil
}

// startGenerate calls eng.Generate but stops waiting for it when the
// watchdog declares the engine stalled or the caller goes away, so an
// engine stuck on admission cannot hold a stream (and the caller's
// migration) hostage. A call given up on is left to return on its own;
// its stream, already cancelled through ctx, is drained so the engine is
// never blocked sending on it.
func startGenerate(ctx context.Context, eng engine.Engine, req *engine.Request, stalled <-chan struct{}) (<-chan engine.Chunk, error) {
	type started struct {
		ch  <-chan engine.Chunk
		err error
	}
	done := make(chan started) // unbuffered: handed over only while we wait
	abandoned := make(chan struct{})
	go func() {
		ch, err := eng.Generate(ctx, req)
		select {
		case done <- started{ch, err}:
		case <-abandoned:
			if err == nil {
				for range ch {
				}
			}
		}
	}()
	select {
	case r := <-done:
		return r.ch, r.err
	case <-stalled:
		close(abandoned)
		return nil, errStalled
	case <-ctx.Done():
		close(abandoned)
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}
