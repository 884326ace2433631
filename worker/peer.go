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
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/transfer"
)

// Hint results, the label of kvmesh_kv_hint_results_total. Every hint that
// reaches a worker with a Peer ends in exactly one of them (a hint ticket,
// hint.go, settles it where it ended, and counts the worker's outcome with
// it); the fleet counts those that never reached a worker
// (kvmesh_fleet_kv_hints_dropped_total).
const (
	HintFetched   = "fetched"   // every hinted block the engine lacked was fetched and inserted
	HintPartial   = "partial"   // a shorter verified prefix was inserted; the rest is recomputed
	HintFallback  = "fallback"  // nothing was inserted (source unreachable, timed out, lacks the blocks…)
	HintUnused    = "unused"    // valid, but nothing to do (no kv.fetch, no source, self, nothing missing)
	HintMalformed = "malformed" // rejected by validation; the request proceeds locally
	HintIgnored   = "ignored"   // unknown protocol_version; ignored
	HintDropped   = "dropped"   // the request ended (cancelled, engine error, stall, shutdown) before the engine consulted the hint
)

var hintResults = []string{HintFetched, HintPartial, HintFallback, HintUnused, HintMalformed, HintIgnored, HintDropped}

// PeerMetrics are the peer-transfer series: the transfer package's
// kvmesh_transfer_* (fetch and serve scopes) and the hint outcomes. One
// PeerMetrics may be shared by every worker of a process (kvmesh serve), so
// the series carry no instance label.
type PeerMetrics struct {
	Transfer *transfer.Metrics
	hints    *prometheus.CounterVec
}

// NewPeerMetrics creates the series and registers them on reg (nil: kept
// but not registered).
func NewPeerMetrics(reg prometheus.Registerer) (*PeerMetrics, error) {
	tm, err := transfer.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	hv := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_kv_hint_results_total",
		Help: "KV hints reaching a worker's fetcher, by result: fetched, partial, fallback, unused, malformed or ignored.",
	}, []string{"result"})
	for _, r := range hintResults {
		hv.WithLabelValues(r)
	}
	if reg != nil {
		if err := reg.Register(hv); err != nil {
			return nil, fmt.Errorf("register hint metrics: %w", err)
		}
	}
	return &PeerMetrics{Transfer: tm, hints: hv}, nil
}

// PeerConfig configures a Peer. Zero values take the defaults noted.
type PeerConfig struct {
	// Listen is where DP rank 0's control endpoint binds (host:port; a
	// wildcard host is fine here). Rank r binds port+r, or its own
	// ephemeral port when port is 0. Empty: the worker consumes hints but
	// serves no blocks (it can then be no hint source).
	Listen string
	// AdvertiseHost is the host peers dial (required with Listen): an IP
	// literal (IPv6 is bracketed in the endpoint) or a hostname; loopback is
	// valid on one host only; 0.0.0.0 and :: are rejected.
	AdvertiseHost string
	// Timeout is the per-fetch operation timeout (default
	// transfer.DefaultTimeout, 1 s).
	Timeout time.Duration
	// ProbeTimeout bounds the dialability check of each advertised
	// endpoint before registration (default 2 s).
	ProbeTimeout time.Duration
	// Metrics, when set, receives transfer and hint series.
	Metrics *PeerMetrics
	// Token, when set, is the fleet token: the control endpoints serve only
	// peers that prove it, and fetches prove it to their sources.
	Token string
	// ServerTLS and ClientTLS, when set, wrap the control endpoints' and
	// the fetches' connections in (mutual) TLS.
	ServerTLS, ClientTLS *tls.Config
	Logger               *slog.Logger
	// FaultAdvertise, for fault injection only (the chaos suite's
	// KVMESH_FAULT_CONTROL_ADVERTISE), replaces the advertised endpoint of
	// each DP rank, so peers reach this worker through a proxy that can
	// corrupt or stall the stream. The probe still has to reach this
	// engine through it. Empty: advertise what was bound.
	FaultAdvertise []string
}

// PeerStats counts hint results since the Peer was made.
type PeerStats struct {
	Fetched, Partial, Fallback, Unused, Malformed, Ignored, Dropped uint64
	// Blocks and Bytes are what fetches inserted into the engine.
	Blocks, Bytes uint64
}

// Peer is a worker's side of peer KV transfer: the transfer client, the
// hint results, and the control endpoints that serve the engine's caches
// (PeerConfig.Listen). The engine's own side attaches to it
// (engine/sim/simpeer for the sim): as the engine's fetcher it consumes
// kv.fetch hints, pulling the hinted blocks the engine lacks from the
// source's control endpoint (checksum and every payload byte verified),
// inserting the longest verified contiguous prefix and leaving the rest to
// be recomputed; it reports each hint's end here (HintEnded). A hint never
// fails a request: whatever goes wrong is counted and the request proceeds
// with what was fetched, possibly nothing.
//
// Failure handling: the worker validates a hint where it enters (admitHint)
// and counts through the Peer those that end there (malformed, ignored,
// unused); an unreachable source fails at once (no wait
// for the deadline); a source that does not finish within Timeout (or the
// request's context) yields nothing, since a timed-out fetch delivers no
// blocks; a source that evicted part of the prefix sends what it still
// holds, which is inserted (partial). Blocks are verified twice: the
// transfer checksum and every payload byte against its derivation on
// receipt, and again by the sim's Insert.
//
// Timing, so TTFT comparisons stay honest: the fetch runs on the request's
// goroutine before it is queued, so the real loopback transfer time is
// spent in wall time (it is part of the TTFT a client measures); then the
// sim charges the fetched blocks in the prefill pass that admits the
// request, TransferBytesPerBlock (default: the sim's own payload size) over
// TransferBandwidth, divided like every pass by SpeedupRatio. Both costs
// are paid; neither is hidden. The twin prices transfers in virtual time
// only.
type Peer struct {
	cfg    PeerConfig
	client *transfer.Client
	log    *slog.Logger

	// Set once by Attach, before the engine can fetch.
	caches             transfer.RankSources
	self               atomic.Pointer[[]string] // own advertised endpoints
	closeOnce          sync.Once
	n                  [7]atomic.Uint64 // by hintResults index
	nBlocks, nBytes    atomic.Uint64
	metricsByResult    [7]prometheus.Counter
	metricsInitialised bool
}

// NewPeer checks pc and returns a Peer for the engine side to attach to
// (engine/sim/simpeer.New). Pass it in worker.Config.Peer so the worker
// serves the engine's blocks and advertises its control endpoints.
func NewPeer(pc PeerConfig) (*Peer, error) {
	if pc.Listen != "" {
		// Fail before starting anything on a host that cannot be advertised.
		if _, err := transfer.AdvertiseEndpoint(pc.AdvertiseHost, 1); err != nil {
			return nil, fmt.Errorf("peer: %w", err)
		}
	}
	return newPeer(pc), nil
}

// StartWithPeer makes a Peer of pc, then the engine that attaches to it
// (start; engine/sim/simpeer.New for the sim), and returns both.
func StartWithPeer[E any](pc PeerConfig, start func(*Peer) (E, error)) (E, *Peer, error) {
	var none E
	p, err := NewPeer(pc)
	if err != nil {
		return none, nil, err
	}
	e, err := start(p)
	if err != nil {
		return none, nil, err
	}
	return e, p, nil
}

func newPeer(pc PeerConfig) *Peer {
	if pc.Timeout <= 0 {
		pc.Timeout = transfer.DefaultTimeout
	}
	if pc.ProbeTimeout <= 0 {
		pc.ProbeTimeout = 2 * time.Second
	}
	if pc.Logger == nil {
		pc.Logger = slog.New(slog.DiscardHandler)
	}
	var tm *transfer.Metrics
	if pc.Metrics != nil {
		tm = pc.Metrics.Transfer
	}
	p := &Peer{cfg: pc, log: pc.Logger, client: transfer.NewClient(transfer.ClientOptions{Timeout: pc.Timeout, Metrics: tm, Token: []byte(pc.Token), TLS: pc.ClientTLS})}
	if pc.Metrics != nil {
		for i, r := range hintResults {
			p.metricsByResult[i] = pc.Metrics.hints.WithLabelValues(r)
		}
		p.metricsInitialised = true
	}
	return p
}

// Attach installs the engine's caches, once, before the engine can fetch.
func (p *Peer) Attach(c transfer.RankSources) { p.caches = c }

// Serving is true when the worker serves the engine's blocks to peers
// (PeerConfig.Listen): the engine then keeps each block's checksum.
func (p *Peer) Serving() bool { return p.cfg.Listen != "" }

// Client is the transfer client fetches go through.
func (p *Peer) Client() *transfer.Client { return p.client }

// Logger is the peer's logger.
func (p *Peer) Logger() *slog.Logger { return p.log }

// Inserted counts blocks and bytes a fetch inserted into the engine.
func (p *Peer) Inserted(blocks, bytes int) {
	p.nBlocks.Add(uint64(blocks))
	p.nBytes.Add(uint64(bytes))
}

// Endpoint is DP rank r's advertised control endpoint ("" before the
// worker serves them, or when it serves none).
func (p *Peer) Endpoint(r int) string {
	if s := p.self.Load(); s != nil && r >= 0 && r < len(*s) {
		return (*s)[r]
	}
	return ""
}

// Digest is the engine's compatibility digest (served and requested); ""
// before Attach.
func (p *Peer) Digest() string {
	if p.caches == nil {
		return ""
	}
	return p.caches.Digest()
}

// Endpoints are the control endpoints the worker advertised, by DP rank
// (nil before the worker started serving them).
func (p *Peer) Endpoints() []string {
	if s := p.self.Load(); s != nil {
		return slices.Clone(*s)
	}
	return nil
}

// Stats returns the hint counters.
func (p *Peer) Stats() PeerStats {
	return PeerStats{Fetched: p.n[0].Load(), Partial: p.n[1].Load(), Fallback: p.n[2].Load(), Unused: p.n[3].Load(),
		Malformed: p.n[4].Load(), Ignored: p.n[5].Load(), Dropped: p.n[6].Load(), Blocks: p.nBlocks.Load(), Bytes: p.nBytes.Load()}
}

// Close closes the transfer client's pooled connections.
func (p *Peer) Close() error {
	p.closeOnce.Do(func() { p.client.Close() })
	return nil
}

func (p *Peer) count(result string) {
	i := slices.Index(hintResults, result)
	p.n[i].Add(1)
	if p.metricsInitialised {
		p.metricsByResult[i].Inc()
	}
}

// IsSelf: ep is the requesting rank's own endpoint. Another DP rank of
// this worker is a separate cache, and a source like any peer.
func (p *Peer) IsSelf(ep string, rank int) bool {
	s := p.self.Load()
	if s == nil {
		return false
	}
	if rank >= 0 && rank < len(*s) {
		return (*s)[rank] == ep
	}
	return slices.Contains(*s, ep)
}

// startControl serves each DP rank's cache on its own control endpoint
// and records them in the discovery record, before the worker
// registers. It is all or nothing: every rank must bind, every endpoint
// must be advertisable (no wildcard host; IPv6 bracketed) and must answer a
// transfer probe with this engine's digest at its advertised address, or
// the worker does not register at all, so peers are never sent to an
// undialable source. The servers stop when ctx ends. Called with w.mu held.
func (w *Worker) startControl(ctx context.Context) error {
	p := w.cfg.Peer
	if p == nil || p.cfg.Listen == "" {
		return nil
	}
	if p.caches == nil {
		return errors.New("peer: not attached to an engine (build it with simpeer.New)")
	}
	if len(w.cfg.ControlEndpoints) > 0 {
		return errors.New("peer: set either Config.ControlEndpoints (served elsewhere) or PeerConfig.Listen, not both")
	}
	if n := p.caches.DPSize(); n != w.cfg.DPSize {
		return fmt.Errorf("peer: the engine runs %d DP ranks, the worker %d", n, w.cfg.DPSize)
	}
	host, portText, err := net.SplitHostPort(p.cfg.Listen)
	if err != nil {
		return fmt.Errorf("control listen address %q: %w", p.cfg.Listen, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 0 || port+w.cfg.DPSize-1 > 65535 {
		return fmt.Errorf("control listen address %q: port must be 0 (ephemeral) or leave room for %d DP ranks below 65536", p.cfg.Listen, w.cfg.DPSize)
	}
	lns := make([]net.Listener, 0, w.cfg.DPSize)
	closeAll := func() {
		for _, ln := range lns {
			ln.Close()
		}
	}
	ports := make([]int, w.cfg.DPSize)
	for r := range w.cfg.DPSize {
		rp := 0
		if port != 0 {
			rp = port + r
		}
		addr := net.JoinHostPort(host, strconv.Itoa(rp))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			closeAll()
			return fmt.Errorf("control endpoint of DP rank %d: listen %s: %w", r, addr, err)
		}
		lns = append(lns, ln)
		ports[r] = ln.Addr().(*net.TCPAddr).Port
	}
	eps, err := transfer.RankEndpoints(p.cfg.AdvertiseHost, 0, w.cfg.DPSize, ports)
	if err != nil {
		closeAll()
		return err
	}
	if fa := p.cfg.FaultAdvertise; len(fa) > 0 {
		if len(fa) != w.cfg.DPSize {
			closeAll()
			return fmt.Errorf("fault advertise: %d endpoints for %d DP ranks", len(fa), w.cfg.DPSize)
		}
		for r, ep := range fa {
			eps[r] = ep
		}
	}
	var tm *transfer.Metrics
	if p.cfg.Metrics != nil {
		tm = p.cfg.Metrics.Transfer
	}
	for r, ln := range lns {
		// Rank r's endpoint serves rank r's cache.
		srv := &transfer.Server{Source: p.caches.RankSource(r), Digest: p.Digest(), Metrics: tm, Logger: w.log, Token: []byte(p.cfg.Token), TLS: p.cfg.ServerTLS}
		w.wg.Go(func() {
			if err := srv.Serve(ctx, ln); err != nil {
				w.log.Error("control endpoint stopped", "addr", ln.Addr().String(), "err", err)
			}
		})
	}
	w.wg.Go(func() {
		<-ctx.Done()
		p.Close()
	})
	list := make([]string, w.cfg.DPSize)
	for r := range list {
		list[r] = eps[r]
		if err := p.probe(ctx, list[r]); err != nil {
			return fmt.Errorf("peer KV transfer requires dialable control endpoints for all DP ranks: rank %d %s (bound %s): %w; not registering",
				r, list[r], lns[r].Addr(), err)
		}
	}
	// Dynamo publishes endpoints, then role, then the capability, so that a
	// half-registered worker is never capability-only. Our discovery record
	// is one JSON value written by one atomic KV put, after this returns and
	// only if every rank answered: a reader sees endpoints, role and the
	// capability they imply (routers treat a worker with endpoints as
	// hint-capable) together or not at all, which is the stronger guarantee.
	w.inst.ControlEndpoints = list
	p.self.Store(&list)
	w.log.Info("serving KV blocks to peers", "control_endpoints", list, "digest", p.Digest())
	return nil
}

// probe dials ep as a peer would and asks for a block nobody holds, with
// this engine's digest: only our own server answers not_found (a stranger
// on that address is refused or fails), so the advertised endpoint is
// proven to reach this engine.
func (p *Peer) probe(ctx context.Context, ep string) error {
	var b [8]byte
	_, _ = rand.Read(b[:])
	c := transfer.NewClient(transfer.ClientOptions{Timeout: p.cfg.ProbeTimeout, MaxIdlePerEndpoint: -1, Token: []byte(p.cfg.Token), TLS: p.cfg.ClientTLS})
	defer c.Close()
	res, err := c.Fetch(ctx, ep, transfer.FetchRequest{Hashes: []uint64{binary.LittleEndian.Uint64(b[:])}, Digest: p.Digest()})
	switch res.Outcome {
	case transfer.OutcomeNotFound, transfer.OutcomeSuccess, transfer.OutcomePartial:
		return nil
	}
	if err == nil {
		err = fmt.Errorf("probe ended %s", res.Outcome)
	}
	return fmt.Errorf("not dialable: %w", err)
}
