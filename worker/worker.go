// Package worker runs one engine as a kvmesh worker: it serves the worker
// API over gRPC (Generate, Events, Dump, Health), registers the instance in
// discovery, publishes the engine's KV events (ring + NATS) and its load,
// and answers dumps from the engine's inventory (engine.Inventory). Several workers can run in one process (kvmesh serve).
//
// It imports engine (and engine/sim, whose block views it serves to peers),
// discovery, eventplane, workerclient, transfer, hints, api and kv; it must
// not import the router, the index, the fleet or the frontend.
package worker

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/eventplane"
	"github.com/kvmesh/kvmesh/hints"
	"github.com/kvmesh/kvmesh/internal/fleetkey"
	"github.com/kvmesh/kvmesh/internal/stages"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/workerclient"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
)

// Config configures a worker. Zero values take the defaults noted.
type Config struct {
	// Model and Role default to the engine's.
	Model string
	Role  kv.Role
	// ListenAddr is where the gRPC server listens; default 127.0.0.1:0.
	ListenAddr string
	// AdvertiseAddr is the host:port other processes dial; default the
	// bound listen address (a wildcard listen address needs it set).
	AdvertiseAddr string
	// InstanceID names this worker; 0 picks a random one.
	InstanceID uint64
	// DPSize is the number of data-parallel ranks the engine serves;
	// default the engine's (engine.Ranked), else 1. An engine.Ranked engine
	// must serve exactly this many.
	DPSize int
	// RingSize is the per-rank event ring for gap repair; default 8192.
	RingSize int
	// LoadInterval is how often load is published; default 1s.
	LoadInterval time.Duration
	// LocalEvents, when set, hands the worker's KV event batches to the
	// feeds of its own process in process (serve's workers); NATS carries
	// them only to whoever else subscribes.
	LocalEvents *eventplane.Local
	// StallTimeout: with streams in flight and no engine output for this
	// long, the worker declares its engine stalled, leaves discovery and
	// fails every stream with Unavailable (see watchdog.go); default
	// DefaultStallTimeout, negative disables.
	StallTimeout time.Duration
	// KVCapacity is blocks per tier name; default {"device": engine blocks}.
	KVCapacity map[string]int
	// ControlEndpoints are the peer-transfer endpoints per DP rank, if any,
	// when something else serves them (with Peer, leave it empty).
	ControlEndpoints []string
	// AcceptsHints, when set, is registered as discovery's accepts_hints
	// (an engine adapter that lowers hints, or one configured not to);
	// nil leaves the routers' default: hint targets exactly when control
	// endpoints are advertised.
	AcceptsHints *bool
	// DecodeOnly registers a decode worker whose engine cannot prefill
	// alone (discovery's decode_only): it is sent decode legs only.
	DecodeOnly bool
	// NoKVEvents registers that the engine publishes no KV events
	// (discovery's no_kv_events): routers predict its cache instead.
	NoKVEvents bool
	// LoRAs are the LoRA adapters the engine serves (registered in
	// discovery); a request naming another adapter is InvalidArgument.
	LoRAs []string
	// EventSources are more KV-event producers beside the engine (the KVCR
	// state agent): each gets the worker's sink at Start, so their events
	// flow through the same log and publisher as the engine's.
	EventSources []EventSource
	// Peer, when set, is the engine's peer-transfer side (NewPeer, attached
	// to by the engine's side, e.g. engine/sim/simpeer.New): the
	// worker serves its blocks on one control endpoint per DP rank and
	// advertises them (see startControl).
	Peer      *Peer
	Discovery discovery.Config
	// Registerer receives the worker's metrics (labelled with its model and
	// instance) from Start until Close; nil keeps them unregistered.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// FleetToken, when set, must be proven on every worker API call
	// (auth.go) and signs the discovery record;
	// give the Peer the same token for its control endpoints.
	FleetToken string
	// TLS, when set, serves the worker API over TLS (mutual when it
	// requires client certificates); give the Peer the same for its
	// control endpoints.
	TLS *tls.Config
	// Engine names the engine kind (sim, vllm, …) in discovery.
	Engine string
	// Tracer, when set, traces every Generate call as a server span, the
	// child of the caller's traceparent (tracing.go); nil: off.
	Tracer trace.Tracer
}

// EventSource is a producer of KV events for this worker's cache.
type EventSource interface {
	SetEventSink(engine.EventSink)
}

// Worker is one running engine instance.
type Worker struct {
	cfg Config
	eng engine.Engine
	nc  *nats.Conn
	log *slog.Logger

	evlog *eventplane.EventLog
	pub   *eventplane.Publisher
	inst  discovery.Instance

	mu      sync.Mutex
	started bool
	closed  bool
	ln      net.Listener
	srv     *grpc.Server
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	hints, transferParams atomic.Int64
	decodeHints           atomic.Int64 // hints dropped on decode handoffs
	foreignParams         atomic.Int64 // connector parameters dropped on legs that take none
	hintWarned            atomic.Bool  // a malformed hint was logged
	hintParser            *hints.Parser
	unauthenticated       atomic.Int64 // worker API calls refused for want of the fleet token
	tlsRefused            atomic.Int64 // worker API connections that failed the TLS handshake
	blockSize             int
	met                   *metrics
	stages                *stages.Recorder // nil without a Registerer
	registered            bool

	wd *watchdog

	// regMu guards reg, which comes and goes with the engine's health
	// (health.go); retired is set once Close or the watchdog took the
	// worker out for good.
	regMu      sync.Mutex
	disc       *discovery.Discovery
	reg        *discovery.Registration
	retired    bool
	engineDown atomic.Bool
}

// New prepares a worker around eng (which it then owns: Close closes it).
// nc may be nil: the worker then serves gRPC only, with no discovery,
// event plane or load reports.
func New(cfg Config, eng engine.Engine, nc *nats.Conn) (*Worker, error) {
	if eng == nil {
		return nil, errors.New("worker: nil engine")
	}
	ec := eng.Config()
	if cfg.Model == "" {
		cfg.Model = ec.Model
	}
	if cfg.Role == "" {
		cfg.Role = ec.Role
	}
	if cfg.Role == "" {
		cfg.Role = kv.RoleAggregated
	}
	if cfg.Model == "" {
		return nil, errors.New("worker: no model name")
	}
	if !cfg.Role.Valid() {
		return nil, fmt.Errorf("worker: unknown role %q (want aggregated, prefill or decode)", cfg.Role)
	}
	for i, l := range cfg.LoRAs {
		if err := discovery.ValidLoRAName(l); err != nil {
			return nil, fmt.Errorf("worker: lora: %w", err)
		}
		if l == cfg.Model || slices.Contains(cfg.LoRAs[:i], l) {
			return nil, fmt.Errorf("worker: lora %q repeats the model name or another adapter", l)
		}
	}
	if cfg.ListenAddr == "" {
		cfg.ListenAddr = "127.0.0.1:0"
	}
	if rk, ok := eng.(engine.Ranked); ok {
		if n := rk.DPSize(); cfg.DPSize == 0 {
			cfg.DPSize = n
		} else if cfg.DPSize != n {
			return nil, fmt.Errorf("worker: dp size %d but the engine runs %d ranks", cfg.DPSize, n)
		}
	}
	if cfg.DPSize == 0 {
		cfg.DPSize = 1
	}
	if cfg.LoadInterval <= 0 {
		cfg.LoadInterval = time.Second
	}
	if cfg.StallTimeout == 0 {
		cfg.StallTimeout = DefaultStallTimeout
	}
	if cfg.KVCapacity == nil {
		cfg.KVCapacity = map[string]int{kv.TierDevice.String(): ec.Blocks}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Discovery.Key == nil {
		// A worker with a fleet token signs its record, so frontends
		// holding the token can tell it from a forgery.
		cfg.Discovery.Key = fleetkey.Derive(cfg.FleetToken, fleetkey.Discovery)
	}
	if cfg.Discovery.Logger == nil {
		cfg.Discovery.Logger = cfg.Logger
	}
	for cfg.InstanceID == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		cfg.InstanceID = binary.LittleEndian.Uint64(b[:]) >> 1 // positive as int64 too
	}
	// Dumps list the engine's own inventory; without one the worker has
	// none to give (see eventplane.EventLog.Dump). Nor with other event
	// sources: their blocks share the engine's event ids but not its list,
	// so a dump would drop them for good.
	var holdings eventplane.Holdings
	if inv, ok := eng.(engine.Inventory); ok && len(cfg.EventSources) == 0 {
		holdings = inventoryHoldings{inv}
	}
	evlog, err := eventplane.NewEventLog(cfg.InstanceID, cfg.RingSize, holdings)
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	w := &Worker{cfg: cfg, eng: eng, nc: nc, log: cfg.Logger.With("instance", natsbus.InstanceToken(cfg.InstanceID), "model", cfg.Model), evlog: evlog, wd: newWatchdog(), blockSize: ec.BlockSize}
	w.hintParser = hints.NewParser(w.log)
	w.pub = eventplane.NewPublisher(nc, cfg.Model, evlog, w.log)
	if cfg.LocalEvents != nil {
		w.pub.UseLocal(cfg.LocalEvents)
	}
	w.met = newMetrics(w)
	w.inst = discovery.Instance{
		ID: cfg.InstanceID, Incarnation: newIncarnation(), Model: cfg.Model, Role: cfg.Role, DPSize: cfg.DPSize,
		BlockSize: ec.BlockSize, KVCapacity: cfg.KVCapacity, MaxBatchedTokens: ec.MaxBatchedTokens,
		MaxModelLen: ec.MaxModelLen, Digest: ec.Digest, ControlEndpoints: cfg.ControlEndpoints, AcceptsHints: cfg.AcceptsHints, Engine: cfg.Engine,
		LoRAs: cfg.LoRAs, TLS: cfg.TLS != nil, FleetToken: cfg.FleetToken != "", DecodeOnly: cfg.DecodeOnly,
		NoKVEvents: cfg.NoKVEvents,
	}
	return w, nil
}

// newIncarnation is this process's discovery.Instance.Incarnation:
// random and non-zero (zero is a record without one).
func newIncarnation() uint64 {
	var b [8]byte
	rand.Read(b[:]) // crypto/rand.Read does not fail
	return binary.LittleEndian.Uint64(b[:]) | 1
}

// inventoryHoldings answers the event log's dumps from the engine.
type inventoryHoldings struct{ inv engine.Inventory }

func (h inventoryHoldings) Holdings(w kv.WorkerKey, mark func()) ([]kv.Event, bool) {
	return h.inv.Inventory(int(w.DPRank), mark)
}

// Start listens, serves the worker API, installs the event sink, registers
// in discovery and starts the load publisher. It returns once registered.
func (w *Worker) Start(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started || w.closed {
		return errors.New("worker: already started or closed")
	}
	w.started = true
	var err error
	if reg := w.cfg.Registerer; reg != nil {
		if err = w.met.register(reg); err != nil {
			return fmt.Errorf("worker: %w", err)
		}
		w.registered = true
		// Shared with the frontend under serve, so never unregistered.
		if w.stages, err = stages.New(reg); err != nil {
			w.met.unregister(reg)
			w.registered = false
			return fmt.Errorf("worker: %w", err)
		}
	}
	ln, err := net.Listen("tcp", w.cfg.ListenAddr)
	if err != nil {
		return fmt.Errorf("worker: listen %s: %w", w.cfg.ListenAddr, err)
	}
	w.ln = ln
	adv := w.cfg.AdvertiseAddr
	if adv == "" {
		adv = ln.Addr().String()
	}
	w.inst.GRPCAddr = adv
	if err := w.inst.Validate(); err != nil {
		ln.Close()
		return fmt.Errorf("worker: %w (set an advertise address)", err)
	}
	w.srv = grpc.NewServer(append([]grpc.ServerOption{grpc.MaxRecvMsgSize(workerclient.MaxMessageBytes), grpc.MaxSendMsgSize(workerclient.MaxMessageBytes)},
		w.authOptions(adv)...)...)
	api.RegisterWorkerServer(w.srv, &server{w: w})
	w.wg.Go(func() {
		if err := w.srv.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			w.log.Error("grpc server stopped", "err", err)
		}
	})
	w.eng.SetEventSink(w.pub.Sink)
	for _, src := range w.cfg.EventSources {
		src.SetEventSink(w.pub.Sink)
	}

	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w.cancel = cancel
	if err := w.startControl(lctx); err != nil {
		w.stopLocked()
		return fmt.Errorf("worker: %w", err)
	}
	if w.nc != nil {
		d, err := discovery.Open(ctx, w.nc, w.cfg.Discovery)
		if err == nil {
			w.regMu.Lock()
			w.disc = d
			w.reg, err = d.Register(ctx, w.inst)
			w.regMu.Unlock()
		}
		if err != nil {
			w.stopLocked()
			return fmt.Errorf("worker: %w", err)
		}
		w.wg.Go(func() {
			eventplane.RunLoadPublisher(lctx, w.nc, w.cfg.Model, w.cfg.LoadInterval, w.loadSample, w.log)
		})
	}
	if w.cfg.StallTimeout > 0 {
		w.wg.Go(func() { w.runWatchdog(lctx) })
	}
	if h, ok := w.eng.(engine.Health); ok {
		w.wg.Go(func() { w.watchHealth(lctx, h) })
	}
	w.log.Info("worker started", "grpc", adv, "role", w.cfg.Role, "dp_size", w.cfg.DPSize)
	return nil
}

// loadSample is one report per DP rank, with that rank's load and last
// event id, when the engine reports per-rank load (engine.Ranked). Other
// engines get one report of their whole load (on rank 0) that announces
// every rank's last event id.
func (w *Worker) loadSample() []eventplane.LoadReport {
	if rk, ok := w.eng.(engine.Ranked); ok {
		out := make([]eventplane.LoadReport, w.cfg.DPSize)
		for rank := range out {
			out[rank] = w.report(rank, rk.RankStats(rank))
		}
		return out
	}
	r := w.report(0, w.eng.Stats())
	if w.cfg.DPSize > 1 {
		// Every rank's last event id, so routers find lost tails on all of
		// them; LastEventID stays rank 0's for routers that predate it.
		r.LastEventIDs = make([]uint64, w.cfg.DPSize)
		for rank := range r.LastEventIDs {
			r.LastEventIDs[rank] = w.evlog.LastID(uint32(rank))
		}
	}
	return []eventplane.LoadReport{r}
}

func (w *Worker) report(rank int, s engine.Stats) eventplane.LoadReport {
	return eventplane.LoadReport{Instance: w.cfg.InstanceID, DPRank: uint32(rank), UsedBlocks: s.UsedBlocks, TotalBlocks: s.TotalBlocks,
		Running: s.Running, Waiting: s.Waiting, PendingPrefillTokens: s.PendingPrefillTokens, LastEventID: w.evlog.LastID(uint32(rank))}
}

// Addr is the advertised gRPC address (after Start).
func (w *Worker) Addr() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.inst.GRPCAddr
}

// Local is how a fleet in this process reaches the worker without gRPC
// (after Start): its service, called directly. It skips the fleet proof,
// which only strangers on the network need.
func (w *Worker) Local() workerclient.Local {
	return workerclient.Local{ID: w.cfg.InstanceID, Addr: w.Addr(), Service: &server{w: w}}
}

// InstanceID names this worker.
func (w *Worker) InstanceID() uint64 { return w.cfg.InstanceID }

// Instance is the discovery record (complete after Start).
func (w *Worker) Instance() discovery.Instance {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.inst
}

// EventLog is the worker's event ring.
func (w *Worker) EventLog() *eventplane.EventLog { return w.evlog }

// EventSubject is where the worker publishes its KV events.
func (w *Worker) EventSubject() string { return w.pub.Subject() }

// Close deregisters (so routers drop the worker at once), stops serving
// (in-flight streams get a few seconds), stops the loops and closes the
// engine.
func (w *Worker) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	if err := w.deregister(ctx); err != nil {
		// NATS away at shutdown: the record expires with its TTL, and
		// routers drop the worker then; the shutdown itself is fine.
		w.log.Warn("worker: could not delete the discovery record; it expires with its TTL", "err", err)
	}
	cancel()
	w.stopLocked()
	if w.registered {
		w.met.unregister(w.cfg.Registerer)
	}
	w.eng.SetEventSink(nil)
	for _, src := range w.cfg.EventSources {
		src.SetEventSink(nil)
	}
	if err := w.eng.Close(); err != nil {
		errs = append(errs, fmt.Errorf("worker: close engine: %w", err))
	}
	w.log.Info("worker stopped")
	return errors.Join(errs...)
}

// deregister deletes the discovery record for good, for Close or the
// watchdog, whichever comes first.
func (w *Worker) deregister(ctx context.Context) error {
	w.regMu.Lock()
	defer w.regMu.Unlock()
	w.retired = true
	if w.reg == nil {
		return nil
	}
	err := w.reg.Close(ctx)
	w.reg = nil
	return err
}

// setListed registers the worker in discovery (up) or deletes its record,
// unless it was retired; a worker without NATS has nothing to do.
func (w *Worker) setListed(ctx context.Context, up bool) error {
	w.regMu.Lock()
	defer w.regMu.Unlock()
	if w.retired || w.disc == nil || up == (w.reg != nil) {
		return nil
	}
	if !up {
		err := w.reg.Close(ctx)
		w.reg = nil
		return err
	}
	reg, err := w.disc.Register(ctx, w.inst)
	if err != nil {
		return err
	}
	w.reg = reg
	return nil
}

func (w *Worker) stopLocked() {
	if w.cancel != nil {
		w.cancel()
	}
	if w.srv != nil {
		done := make(chan struct{})
		go func() { w.srv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			w.srv.Stop()
			<-done
		}
	}
	w.wg.Wait()
}
