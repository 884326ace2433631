package frontend

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/hints"
	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/runtime"
)

// ClusterConfig wires a Cluster to the control plane.
type ClusterConfig struct {
	NC        *nats.Conn
	Discovery *runtime.Discovery
	// Models are the served models with their preprocessing; the cluster
	// routes each to the workers that register under its name.
	Models []*Model
	// Router configures worker selection. Matcher is set by the cluster (its
	// event-fed index) unless the mode needs none.
	Router router.Config
	// ReplicaSync shares load bookings with other frontend replicas.
	ReplicaSync bool
	// InhibitFor keeps a worker that failed a request out of routing
	// (default 5 s); discovery removes it for good once its TTL lapses.
	InhibitFor time.Duration
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// replicaSyncScope names the replica-sync subject every frontend shares.
const replicaSyncScope = "all-models"

// Cluster is the Backend over live workers: discovery feeds the router's
// worker set, the event plane feeds its index, load reports feed its busy
// thresholds, and requests go to the chosen worker over gRPC.
type Cluster struct {
	cfg     ClusterConfig
	log     *slog.Logger
	index   *index.Index
	router  *router.Router
	clients *runtime.WorkerClients
	models  StaticModels

	mu        sync.Mutex
	instances map[uint64]runtime.Instance
	inhibited map[kv.WorkerKey]time.Time

	cancel   context.CancelFunc
	wg       sync.WaitGroup
	watchers []*runtime.Watcher
	feeds    map[string]*runtime.EventFeed
	metrics  []prometheus.Collector // registered on cfg.Registerer; removed at Close
	subs     []*nats.Subscription
	bcast    *runtime.Broadcast
}

// NewCluster starts following the workers of every configured model.
func NewCluster(ctx context.Context, cfg ClusterConfig) (*Cluster, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.InhibitFor <= 0 {
		cfg.InhibitFor = 5 * time.Second
	}
	c := &Cluster{cfg: cfg, log: cfg.Logger, index: index.New(), clients: runtime.NewWorkerClients(),
		instances: map[uint64]runtime.Instance{}, inhibited: map[kv.WorkerKey]time.Time{},
		feeds: map[string]*runtime.EventFeed{}}
	rc := cfg.Router
	if rc.Mode == router.ModeKV || rc.Mode == "" {
		rc.Matcher = c.index
	}
	rc.Registerer = cfg.Registerer
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
	if cfg.ReplicaSync {
		// Replica events name workers, not models: one subject serves all.
		c.bcast, err = runtime.NewBroadcast(cfg.NC, runtime.SyncSubject(replicaSyncScope, "router"), r.ID(), func(_ string, data []byte) {
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
	ctx, c.cancel = context.WithCancel(ctx)
	for _, m := range cfg.Models {
		c.models.Add(m)
		if err := c.follow(ctx, m.Name); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// follow subscribes to one model's discovery records, events and load.
func (c *Cluster) follow(ctx context.Context, model string) error {
	feed, err := runtime.NewEventFeed(c.cfg.NC, runtime.FeedConfig{Model: model, Applier: c.index,
		Repairer: runtime.GRPCRepairer{Clients: c.clients}, Logger: c.log})
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
	w, err := c.cfg.Discovery.Watch(ctx, model, func(ev runtime.DiscoveryEvent) {
		c.discovered(ev)
		feed.OnDiscovery(ev)
	})
	if err != nil {
		return fmt.Errorf("watching %s: %w", model, err)
	}
	c.watchers = append(c.watchers, w)
	sub, err := runtime.SubscribeLoad(c.cfg.NC, model, func(r runtime.LoadReport) {
		// A DP worker reports each rank on its own; its load is that key's.
		k := kv.WorkerKey{Instance: r.Instance, DPRank: r.DPRank}
		c.router.UpdateLoad(k, r.UsedBlocks, r.TotalBlocks, r.Running, r.Waiting)
		feed.OnLoadReport(r) // finds events lost at a stream's end: this rank's, or every rank LastEventIDs lists
	}, func(err error) { c.log.Debug("bad load report", "err", err) })
	if err != nil {
		return fmt.Errorf("load reports of %s: %w", model, err)
	}
	c.subs = append(c.subs, sub)
	return nil
}

// discovered keeps the router's worker set equal to discovery's.
func (c *Cluster) discovered(ev runtime.DiscoveryEvent) {
	in := ev.Instance
	if ev.Kind == runtime.InstanceRemoved {
		c.mu.Lock()
		delete(c.instances, in.ID)
		c.mu.Unlock()
		for _, k := range in.Workers() {
			c.router.RemoveWorker(k)
		}
		c.clients.Forget(in.ID)
		c.log.Info("worker removed", "instance", fmt.Sprintf("%x", in.ID), "model", in.Model)
		return
	}
	c.mu.Lock()
	prev, had := c.instances[in.ID]
	c.instances[in.ID] = in
	c.mu.Unlock()
	if had {
		// A re-registration with fewer DP ranks: the dropped ranks go.
		for _, k := range prev.Workers()[min(len(prev.Workers()), len(in.Workers())):] {
			c.router.RemoveWorker(k)
		}
	}
	for r, k := range in.Workers() {
		info := router.WorkerInfo{Key: k, Model: in.Model, Role: in.Role, BlockSize: in.BlockSize,
			KVBlocks: in.KVCapacity[kv.TierDevice.String()], MaxBatchedTokens: in.MaxBatchedTokens, Digest: in.Digest}
		if r < len(in.ControlEndpoints) {
			info.ControlEndpoint, info.HintCapable = in.ControlEndpoints[r], true
		}
		if err := c.router.AddWorker(info); err != nil {
			c.log.Warn("worker not routable", "instance", fmt.Sprintf("%x", in.ID), "err", err)
		}
	}
	c.log.Info("worker added", "instance", fmt.Sprintf("%x", in.ID), "model", in.Model, "grpc", in.GRPCAddr)
}

// Ready reports whether every served model has a worker.
func (c *Cluster) Ready() error {
	for _, m := range c.cfg.Models {
		if len(c.router.Workers(m.Name, kv.RoleAggregated)) == 0 {
			return fmt.Errorf("no worker serves %s yet", m.Name)
		}
	}
	return nil
}

// Router exposes the router (for metrics and tests).
func (c *Cluster) Router() *router.Router { return c.router }

// Index exposes the event-fed index (for tests).
func (c *Cluster) Index() *index.Index { return c.index }

// Feed is the event feed of a served model (for stats and tests); nil for
// a model the cluster does not serve.
func (c *Cluster) Feed(model string) *runtime.EventFeed { return c.feeds[model] }

// Model and Models make the cluster a ModelSource.
func (c *Cluster) Model(name string) (*Model, bool) { return c.models.Model(name) }
func (c *Cluster) Models() []*Model                 { return c.models.Models() }

// MaxContext is the context every worker of model can hold: the smallest
// device KV capacity (blocks × block size) among them, so a request that
// passes fits wherever it is routed (0: no worker reports its capacity).
func (c *Cluster) MaxContext(model string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	limit := 0
	for _, in := range c.instances {
		if in.Model != model {
			continue
		}
		if n := in.KVCapacity[kv.TierDevice.String()] * in.BlockSize; n > 0 && (limit == 0 || n < limit) {
			limit = n
		}
	}
	return limit
}

func (c *Cluster) inhibit(k kv.WorkerKey) {
	c.mu.Lock()
	c.inhibited[k] = time.Now().Add(c.cfg.InhibitFor)
	c.mu.Unlock()
}

func (c *Cluster) excluded() []kv.WorkerKey {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []kv.WorkerKey
	now := time.Now()
	for k, until := range c.inhibited {
		if now.After(until) {
			delete(c.inhibited, k)
			continue
		}
		out = append(out, k)
	}
	return out
}

// Generate routes the request and streams it from the chosen worker.
func (c *Cluster) Generate(ctx context.Context, req *GenerateRequest) (TokenStream, error) {
	d, err := c.router.Route(ctx, router.Request{Model: req.Model, Tokens: req.Tokens, Exclude: c.excluded()})
	if err != nil {
		return nil, err // router.BusyError and router.ErrNoWorkers reach the handler as they are
	}
	c.mu.Lock()
	in, ok := c.instances[d.Worker.Instance]
	c.mu.Unlock()
	if !ok {
		d.Done()
		return nil, fmt.Errorf("worker %v left before the request reached it: %w", d.Worker, ErrWorkerLost)
	}
	client, err := c.clients.Get(in)
	if err != nil {
		d.Done()
		c.inhibit(d.Worker)
		return nil, fmt.Errorf("%v: %w", err, ErrWorkerLost)
	}
	greq := &api.GenerateRequest{RequestId: req.RequestID, Tokens: req.Tokens, DpRank: d.Worker.DPRank}
	api.SamplingToProto(greq, &req.Sampling)
	if h := d.Hint; h != nil {
		greq.KvHint = hints.NewFetch(d.ID, h.Endpoint, h.SeqHashes).Marshal()
	}
	sctx, cancel := context.WithCancel(ctx)
	st, err := client.Generate(sctx, greq)
	if err != nil {
		cancel()
		d.Done()
		c.inhibit(d.Worker)
		return nil, fmt.Errorf("worker %v: %v: %w", d.Worker, err, ErrWorkerLost)
	}
	return &workerStream{c: c, d: d, st: st, ctx: ctx, cancel: cancel}, nil
}

type workerStream struct {
	c      *Cluster
	d      *router.Decision
	st     api.Worker_GenerateClient
	ctx    context.Context // the caller's: tells its cancellation from ours
	cancel context.CancelFunc
	first  bool
	done   bool
	msg    api.GenerateChunk // reused by every Recv: the codec resets it, and a chunk keeps only its own Tokens slice
}

func (s *workerStream) Recv() (TokenChunk, error) {
	if s.done {
		return TokenChunk{}, io.EOF
	}
	m := &s.msg
	err := s.st.RecvMsg(m)
	if err != nil {
		s.finish()
		if err == io.EOF {
			// The worker closed the stream without a finish reason.
			s.c.inhibit(s.d.Worker)
			return TokenChunk{}, fmt.Errorf("worker %v ended the stream early: %w", s.d.Worker, ErrWorkerLost)
		}
		switch status.Code(err) {
		case codes.Canceled, codes.DeadlineExceeded:
			// Only the caller's cancellation is the caller's: a stream
			// cancelled because discovery dropped the worker (Forget closes
			// its connection) is a lost worker and may be migrated.
			if s.ctx.Err() != nil {
				return TokenChunk{}, err
			}
		case codes.InvalidArgument:
			return TokenChunk{}, fmt.Errorf("%w: %s", ErrRejected, status.Convert(err).Message())
		}
		s.c.inhibit(s.d.Worker)
		return TokenChunk{}, fmt.Errorf("worker %v: %v: %w", s.d.Worker, err, ErrWorkerLost)
	}
	if !s.first && len(m.Tokens) > 0 {
		s.first = true
		s.d.FirstToken()
	}
	ch := TokenChunk{Tokens: m.Tokens, Finish: kv.FinishReason(m.FinishReason)}
	if ch.Finish == kv.FinishError {
		s.finish()
		return TokenChunk{}, fmt.Errorf("worker %v: engine error: %s", s.d.Worker, m.Error)
	}
	if u := m.Usage; u != nil {
		ch.PromptTokens, ch.CachedTokens = int(u.PromptTokens), int(u.CachedTokens)
	}
	if ch.Finish != "" {
		s.finish()
	}
	return ch, nil
}

func (s *workerStream) finish() {
	if !s.done {
		s.done = true
		s.d.Done()
	}
}

func (s *workerStream) Close() error {
	s.cancel()
	s.finish()
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
