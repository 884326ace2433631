package fleet

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/eventplane"
	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/internal/stages"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/workerclient"
)

// Config wires a Cluster to the control plane.
type Config struct {
	NC        *nats.Conn
	Discovery *discovery.Discovery
	// Models are the served model names; the cluster routes each to the
	// workers that register under it.
	Models []string
	// Router configures worker selection, and how long a worker that failed
	// a request stays out of it (InhibitFor). Matcher is set by the cluster
	// (its event-fed index) in every mode but kv-approx.
	Router router.Config
	// TierLoad is every worker's per-block onboarding time per tier, for
	// the router's time cost (router.WorkerInfo.TierLoad); zero: the
	// fixed tier credits.
	TierLoad router.TierLoad
	// Disagg configures conditional disaggregation for models with prefill
	// and decode workers (disagg.go).
	Disagg router.DisaggConfig
	// ReplicaSync shares load bookings with other frontend replicas.
	ReplicaSync bool
	Registerer  prometheus.Registerer
	Logger      *slog.Logger
	// FleetToken, when set, is sent on every worker API call.
	FleetToken string
	// TLS, when set, is the worker clients' TLS (with a client certificate
	// for workers that require mutual TLS).
	TLS *tls.Config
	// RejoinWait is how long after a model lost a worker a request that
	// finds none waits for one to register (again) before it fails with
	// kv.ErrNoWorkers; default DefaultRejoinWait, negative: never.
	RejoinWait time.Duration
	// Queue, when set, holds a whole request no worker admits
	// (Router.Admit) in the router queue instead of answering busy
	// (queue.go); it also turns on the router's routed-block credit.
	Queue *router.QueueConfig
	// Local are workers of this process (serve's), called directly
	// rather than over gRPC while discovery lists them at their address.
	Local []workerclient.Local
	// LocalEvents carries those workers' KV events to the model feeds in
	// process (eventplane.Local); nil: NATS only.
	LocalEvents *eventplane.Local
}

// replicaSyncScope names the replica-sync subject every frontend shares.
const replicaSyncScope = "all-models"

// Cluster is the live backend: discovery feeds its instance table, which
// drives the router's worker set, the event feeds and the client pool; the
// event plane feeds the router's index, load reports its busy thresholds,
// and requests go to the chosen worker over gRPC.
type Cluster struct {
	cfg       Config
	log       *slog.Logger
	index     *index.Index
	router    *router.Router
	clients   *workerclient.Pool
	instances *instances
	dmet      *disaggMetrics
	stats     *workerStats

	cancel   context.CancelFunc
	wg       sync.WaitGroup
	watchers []*discovery.Watcher
	feeds    map[string]*eventplane.Feed
	metrics  []prometheus.Collector // registered on cfg.Registerer; removed at Close
	creds    *credRefusals
	subs     []*nats.Subscription
	bcast    *natsbus.Broadcast
	// hintDrops counts planned hints that never reached a worker (hints.go).
	hintDrops *prometheus.CounterVec
	queue     *liveQueue // nil without Config.Queue
}

// New starts following the workers of every configured model.
func New(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := cfg.Disagg.Validate(); err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg, log: cfg.Logger, index: index.New(), clients: workerclient.NewPool(fleetDialOptions(cfg)...),
		feeds: map[string]*eventplane.Feed{}, dmet: newDisaggMetrics(), hintDrops: newHintDrops(), creds: newCredRefusals()}
	for _, l := range cfg.Local {
		c.clients.AddLocal(l)
	}
	rc := cfg.Router
	if rc.Mode != router.ModeKVApprox {
		// kv routes by it; round-robin and random measure their routing
		// regret against it (kvmesh_router_prefix_tokens_total).
		rc.Matcher = c.index
	}
	rc.Registerer = cfg.Registerer
	if cfg.Queue != nil {
		rc.CreditRouted = true
	}
	if rc.Logger == nil {
		rc.Logger = c.log
	}
	if cfg.ReplicaSync {
		rc.OnReplicaEvent = func(ev router.ReplicaEvent) {
			if b, err := ev.MarshalBinary(); err == nil && c.bcast != nil {
				_ = c.bcast.Publish(b)
			}
		}
	}
	r, err := router.New(rc)
	if err != nil {
		return nil, err
	}
	c.router = r
	if reg := cfg.Registerer; reg != nil {
		for _, col := range c.dmet.collectors() {
			if err := reg.Register(col); err != nil {
				c.Close()
				return nil, fmt.Errorf("disaggregation metrics: %w", err)
			}
			c.metrics = append(c.metrics, col)
		}
	}
	c.instances = newInstances(r, c.clients, c.log)
	c.instances.tierLoad = cfg.TierLoad
	c.stats = newWorkerStats(c.instances)
	if reg := cfg.Registerer; reg != nil {
		if err := reg.Register(c.stats); err != nil {
			return nil, fmt.Errorf("per-worker metrics: %w", err)
		}
		c.metrics = append(c.metrics, c.stats)
	}
	if cfg.ReplicaSync {
		// Replica events name workers, not models: one subject serves all.
		c.bcast, err = natsbus.NewBroadcast(cfg.NC, natsbus.SyncSubject(replicaSyncScope, "router"), r.ID(), func(_ string, data []byte) {
			var ev router.ReplicaEvent
			if err := ev.UnmarshalBinary(data); err != nil {
				c.log.Debug("bad replica event", "err", err)
				return
			}
			if err := r.ApplyReplicaEvent(ev); err != nil {
				c.log.Debug("replica event rejected", "err", err)
			}
		})
		if err != nil {
			return nil, fmt.Errorf("replica sync: %w", err)
		}
	}
	if reg := cfg.Registerer; reg != nil {
		if err := reg.Register(c.hintDrops); err != nil {
			c.Close()
			return nil, fmt.Errorf("hint metrics: %w", err)
		}
		c.metrics = append(c.metrics, c.hintDrops)
		if err := reg.Register(c.creds.count); err != nil {
			c.Close()
			return nil, fmt.Errorf("credential metrics: %w", err)
		}
		c.metrics = append(c.metrics, c.creds.count)
	}
	ctx, c.cancel = context.WithCancel(ctx)
	if cfg.Queue != nil {
		if c.queue, err = newLiveQueue(r, *cfg.Queue); err != nil {
			c.Close()
			return nil, err
		}
		for _, col := range c.queue.collectors() {
			if reg := cfg.Registerer; reg != nil {
				if err := reg.Register(col); err != nil {
					c.Close()
					return nil, fmt.Errorf("queue metrics: %w", err)
				}
				c.metrics = append(c.metrics, col)
			}
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.queue.run(ctx)
		}()
	}
	for _, m := range cfg.Models {
		if err := c.follow(ctx, m); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// follow subscribes to one model's discovery records, events and load.
func (c *Cluster) follow(ctx context.Context, model string) error {
	feed, err := eventplane.NewFeed(c.cfg.NC, eventplane.FeedConfig{Model: model, Applier: c.index,
		Repairer: workerclient.Repairer{Clients: c.clients}, Local: c.cfg.LocalEvents, Logger: c.log})
	if err != nil {
		return fmt.Errorf("event feed for %s: %w", model, err)
	}
	c.feeds[model] = feed
	if reg := c.cfg.Registerer; reg != nil {
		col := feed.Collector()
		if err := reg.Register(col); err != nil {
			return fmt.Errorf("event feed metrics for %s: %w", model, err)
		}
		c.metrics = append(c.metrics, col)
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		if err := feed.Run(ctx); err != nil && ctx.Err() == nil {
			c.log.Error("event feed stopped", "model", model, "err", err)
		}
	}()
	w, err := c.cfg.Discovery.Watch(ctx, model, func(ev discovery.Event) { c.instances.apply(ev, feed) })
	if err != nil {
		return fmt.Errorf("watching %s: %w", model, err)
	}
	c.watchers = append(c.watchers, w)
	sub, err := eventplane.SubscribeLoad(c.cfg.NC, model, func(r eventplane.LoadReport) {
		// A DP worker reports each rank on its own; its load is that key's.
		k := kv.WorkerKey{Instance: r.Instance, DPRank: r.DPRank}
		c.router.UpdateLoad(k, r.UsedBlocks, r.TotalBlocks, r.Running, r.Waiting)
		c.stats.onLoad(r)
		feed.OnLoadReport(r) // finds events lost at a stream's end: this rank's, or every rank LastEventIDs lists
	}, func(err error) { c.log.Debug("bad load report", "err", err) })
	if err != nil {
		return fmt.Errorf("load reports of %s: %w", model, err)
	}
	c.subs = append(c.subs, sub)
	return nil
}

// Ready reports whether every served model can be served: by aggregated
// workers, or by prefill and decode workers together. The error says why
// not (e.g. prefill workers but no decode workers).
func (c *Cluster) Ready() error {
	for _, m := range c.cfg.Models {
		if why := c.router.PoolSizes(m).Unservable(m); why != "" {
			return errors.New(why)
		}
	}
	return nil
}

// MaxContext is the context every worker of model can hold: the smallest
// device KV capacity (blocks × block size) among them, so a request that
// passes fits wherever it is routed (0: no worker reports its capacity).
func (c *Cluster) MaxContext(model string) int { return c.instances.maxContext(model) }

// Adapters lists, sorted, the LoRA adapters the workers of model registered
// (discovery's loras): a request names one in its model field.
func (c *Cluster) Adapters(model string) []string { return c.instances.loras(model) }

// Generate routes the request and streams it from the chosen worker: the
// aggregated pool, or prefill then decode legs when the model has both
// (disagg.go).
//
// When no worker can take the request but the model lost one less than
// Config.RejoinWait ago, it waits (within that window and the request's
// context) for discovery to list a worker again, then routes anew: every
// record expires at once when NATS restarts, and workers put theirs back
// within a second of reconnecting; a crashed worker may be restarted.
func (c *Cluster) Generate(ctx context.Context, req *kv.GenerateRequest) (kv.TokenStream, error) {
	return awaitRejoin(ctx, c.instances, req.Model, c.cfg.RejoinWait, func() (kv.TokenStream, error) { return c.generate(ctx, req) })
}

// DefaultRejoinWait is Config.RejoinWait's default.
const DefaultRejoinWait = 5 * time.Second

// awaitRejoin runs gen, and again after each change of the instance table
// while it fails with kv.ErrNoWorkers and model lost an instance less than
// window ago.
func awaitRejoin(ctx context.Context, t *instances, model string, window time.Duration, gen func() (kv.TokenStream, error)) (kv.TokenStream, error) {
	if window == 0 {
		window = DefaultRejoinWait
	}
	for {
		// Taken before routing, so a worker that joins in between wakes us.
		changed, until, ok := t.rejoin(model, window)
		st, err := gen()
		if err == nil || !ok || !errors.Is(err, kv.ErrNoWorkers) {
			return st, err
		}
		timer := time.NewTimer(time.Until(until))
		select {
		case <-changed:
			timer.Stop()
		case <-timer.C:
			return nil, err
		case <-ctx.Done():
			timer.Stop()
			return nil, err
		}
	}
}

// routeErr maps a routing error to what the frontend reports.
func routeErr(err error) error {
	var busy *kv.BusyError
	switch {
	case errors.As(err, &busy):
		return &kv.BusyError{RetryAfter: busy.RetryAfter}
	case errors.Is(err, kv.ErrQueueFull):
		return err
	case errors.Is(err, router.ErrDecodeOnly):
		return err // says why
	case errors.Is(err, kv.ErrNoWorkers):
		return kv.ErrNoWorkers
	}
	return err
}

// legName names a proto leg for spans.
func legName(l api.Leg) string {
	switch l {
	case api.Leg_LEG_PREFILL:
		return kv.LegPrefill.String()
	case api.Leg_LEG_DECODE:
		return kv.LegDecode.String()
	}
	return kv.LegWhole.String()
}

// protoRequest is req for the worker d chose.
func (c *Cluster) protoRequest(req *kv.GenerateRequest, d *router.Decision) *api.GenerateRequest {
	greq := &api.GenerateRequest{RequestId: req.RequestID, Tokens: req.Tokens, DpRank: d.Worker.DPRank,
		Lora: req.LoRA, CacheSalt: req.CacheSalt}
	api.SamplingToProto(greq, &req.Sampling)
	return greq
}

// open sends greq to d's worker and returns its stream, which owns d.
func (c *Cluster) open(ctx context.Context, d *router.Decision, greq *api.GenerateRequest) (*workerStream, error) {
	in, ok := c.instances.get(d.Worker.Instance)
	if !ok {
		c.dropHint(d, hintDropWorkerLeft)
		d.Done()
		return nil, fmt.Errorf("worker %v left before the request reached it: %w", d.Worker, kv.ErrWorkerLost)
	}
	if cred := c.missingCredential(in); cred != "" {
		// A configuration error: no dial, no inhibition, no migration.
		c.dropHint(d, hintDropUnreachable)
		d.Done()
		return nil, c.credentialsRefused(in, d.Worker, cred, nil)
	}
	client, err := c.clients.Get(in)
	if err != nil {
		c.dropHint(d, hintDropUnreachable)
		d.Fail()
		return nil, fmt.Errorf("%v: %w", err, kv.ErrWorkerLost)
	}
	sctx, cancel := streamContext(ctx, d.Hint != nil)
	sctx, sp := workerSpan(sctx, d, greq)
	st, err := client.Generate(api.WithTraceContext(sctx), greq)
	if err != nil {
		endSpan(sp, err)
		cancel()
		if ctx.Err() != nil {
			c.dropHint(d, hintDropCancelled)
		} else {
			c.dropHint(d, hintDropUnreachable)
		}
		if cred := refusedCredential(err); cred != "" {
			d.Done()
			return nil, c.credentialsRefused(in, d.Worker, cred, err)
		}
		d.Fail()
		return nil, fmt.Errorf("worker %v: %v: %w", d.Worker, err, kv.ErrWorkerLost)
	}
	stages.From(ctx).Mark(stages.Dispatch)
	ws := &workerStream{d: d, st: st, ctx: ctx, cancel: cancel, counts: c.stats.routed(d, greq.Leg != api.Leg_LEG_DECODE), span: sp,
		cl: c, in: in}
	if d.Hint != nil {
		ws.cancel = holdCancel(ctx, st, cancel)
	}
	if ls, ok := st.(localStream); ok {
		ws.local = ls
	}
	return ws, nil
}

// localStream is the caller's side of a call to a worker in process
// (workerclient.Local): its chunks are the worker's own messages, shared,
// not copied, and it says without blocking whether one is waiting.
type localStream interface {
	Recv() (*api.GenerateChunk, error)
	TryRecv() (*api.GenerateChunk, bool)
}

// polledStream is a whole-request stream from a worker in process. Its
// TryRecv lets the frontend write every chunk already waiting before one
// flush, without a goroutine of its own to find out whether one is.
type polledStream struct{ *workerStream }

// TryRecv is Recv when a chunk is already waiting (ok); otherwise it
// returns at once with ok false, and the end or a failure is Recv's to
// report.
func (s polledStream) TryRecv() (kv.TokenChunk, bool, error) {
	if s.done {
		return kv.TokenChunk{}, false, nil
	}
	m, ok := s.local.TryRecv()
	if !ok {
		return kv.TokenChunk{}, false, nil
	}
	ch, err := s.chunk(m)
	return ch, true, err
}

type workerStream struct {
	d      *router.Decision
	st     api.Worker_GenerateClient
	ctx    context.Context // the caller's: tells its cancellation from ours
	cancel context.CancelFunc
	first  bool
	done   bool
	msg    api.GenerateChunk  // reused by every Recv: the codec resets it, and a chunk keeps only its own Tokens slice
	local  localStream        // st, when the worker is in process (nil: gRPC)
	last   *api.GenerateChunk // the message Recv last returned a chunk of (&msg, or the worker's own)
	counts *workerCounts      // the worker's, for the per-worker series
	span   trace.Span         // worker.generate (tracing.go; nil: none); ends with the stream
	cl     *Cluster
	in     discovery.Instance // the worker's record, for a credentials refusal
}

func (s *workerStream) Recv() (kv.TokenChunk, error) {
	if s.done {
		return kv.TokenChunk{}, io.EOF
	}
	var m *api.GenerateChunk
	var err error
	if s.local != nil {
		m, err = s.local.Recv() // the worker's message itself: no copy
	} else {
		m = &s.msg
		err = s.st.RecvMsg(m)
	}
	if err != nil {
		return kv.TokenChunk{}, s.recvErr(err)
	}
	return s.chunk(m)
}

// recvErr is what Recv returns for the stream's error err; the stream has
// ended.
func (s *workerStream) recvErr(err error) error {
	if err == io.EOF {
		// The worker closed the stream without a finish reason.
		return s.fail(fmt.Errorf("worker %v ended the stream early: %w", s.d.Worker, kv.ErrWorkerLost))
	}
	switch status.Code(err) {
	case codes.Canceled, codes.DeadlineExceeded:
		// Only the caller's cancellation is the caller's: a stream
		// cancelled because discovery dropped the worker (Forget closes
		// its connection) is a lost worker and may be migrated.
		if s.ctx.Err() != nil {
			s.finish(err)
			return err
		}
	case codes.InvalidArgument:
		err = fmt.Errorf("%w: %s", kv.ErrRejected, status.Convert(err).Message())
		s.finish(err)
		return err
	}
	if cred := refusedCredential(err); cred != "" && s.cl != nil {
		// The frontend's configuration, not the worker: not inhibited.
		err = s.cl.credentialsRefused(s.in, s.d.Worker, cred, err)
		s.finish(err)
		return err
	}
	return s.fail(fmt.Errorf("worker %v: %v: %w", s.d.Worker, err, kv.ErrWorkerLost))
}

// chunk is the worker's message m as the caller's chunk (or the error it
// carries), with the stream's bookkeeping.
func (s *workerStream) chunk(m *api.GenerateChunk) (kv.TokenChunk, error) {
	s.last = m
	if !s.first && len(m.Tokens) > 0 {
		s.first = true
		s.d.FirstToken()
	}
	ch := kv.TokenChunk{Tokens: m.Tokens, Finish: kv.FinishReason(m.FinishReason)}
	if kv.FinishReason(m.FinishReason) == kv.FinishError {
		err := fmt.Errorf("worker %v: engine error: %s", s.d.Worker, m.Error)
		s.finish(err)
		return kv.TokenChunk{}, err
	}
	if u := m.Usage; u != nil {
		ch.PromptTokens, ch.CachedTokens = int(u.PromptTokens), int(u.CachedTokens)
		ch.CachedByTier = api.CachedFromProto(u)
	}
	s.counts.chunk(len(m.Tokens), ch.PromptTokens, ch.CachedTokens, ch.CachedByTier)
	if ch.Finish != "" {
		if s.span != nil && s.span.IsRecording() {
			s.span.SetAttributes(attribute.String("kvmesh.finish_reason", string(ch.Finish)),
				attribute.Int("kvmesh.worker_cached_tokens", ch.CachedTokens))
		}
		s.finish(nil)
	}
	return ch, nil
}

// params are the connector parameters of the last chunk received (a
// prefill leg's answer); the gRPC codec reuses them with the message.
func (s *workerStream) params() []byte {
	if s.last == nil {
		return nil
	}
	return s.last.KvTransferParams
}

// finish ends the stream; err (nil: none) is what its span records.
func (s *workerStream) finish(err error) {
	if !s.done {
		s.done = true
		s.d.Done()
		endSpan(s.span, err)
	}
}

// fail ends the stream on a lost worker: the router keeps it out of
// selection for a while. It returns err.
func (s *workerStream) fail(err error) error {
	if !s.done {
		s.done = true
		s.d.Fail()
		endSpan(s.span, err)
	}
	return err
}

func (s *workerStream) Close() error {
	s.cancel()
	s.finish(nil)
	return nil
}

// Close stops following the cluster.
func (c *Cluster) Close() {
	for _, w := range c.watchers {
		w.Close()
	}
	for _, s := range c.subs {
		_ = s.Unsubscribe()
	}
	if c.bcast != nil {
		_ = c.bcast.Close()
	}
	if c.cancel != nil {
		c.cancel()
	}
	c.wg.Wait()
	c.clients.Close()
	for _, col := range c.metrics {
		c.cfg.Registerer.Unregister(col)
	}
}
