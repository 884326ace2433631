package remote

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/kv"
)

// Base is the part of an adapter every engine shares: the engine's
// description, the /health poll, the background loops reading the load,
// the KV-event relay (when there is one) and Close. An adapter embeds it
// (or Ranks, for a server with data-parallel ranks), calls Attach first
// and Start once it has read the server's description.
type Base struct {
	ecfg   engine.Config
	log    *slog.Logger
	client *http.Client
	url    string
	health *HealthMonitor
	relay  *Relay

	statsInterval time.Duration
	closed        atomic.Bool
	ctx           context.Context
	cancel        context.CancelFunc
	wg            sync.WaitGroup
}

// Attach takes the client and a logger naming the engine from cfg (after
// Config.WithDefaults) and waits until the server's /health answers,
// bounded by ctx.
func (b *Base) Attach(ctx context.Context, cfg Config) error {
	b.client, b.log, b.url = cfg.Client, cfg.Logger.With("engine", cfg.URL), cfg.URL
	return WaitHealthy(ctx, b.client, cfg.URL+"/health")
}

// BlockSizeRule says how an adapter names its engine's block size when it
// settles it (Base.SettleBlockSize).
type BlockSizeRule struct {
	Default int    // the engine's own default
	Engine  string // "vLLM engine", in "the vLLM engine at URL"
	Uses    string // what the engine does with it, a format of its size: "uses blocks of %d tokens"
	Unknown string // the warning when neither the server nor --block-size gives it
	Key     string // the warning's attribute: "block_size"
}

// SettleBlockSize is the block size of a server that reported reported
// (0: nothing) under --block-size pinned (0: not pinned): the server's,
// else the pinned one, else the engine's default (warned). A pinned size
// the server contradicts is an error.
func (b *Base) SettleBlockSize(reported, pinned int, r BlockSizeRule) (int, error) {
	switch {
	case reported == 0 && pinned == 0:
		b.log.Warn(r.Unknown, r.Key, r.Default)
		return r.Default, nil
	case reported == 0:
		return pinned, nil
	case pinned != 0 && pinned != reported:
		return 0, fmt.Errorf("--block-size %d but the %s at %s "+r.Uses, pinned, r.Engine, b.url, reported)
	}
	return reported, nil
}

// AttachModel is Attach, then PickModel: the /v1/models entry of
// cfg.Model (or the first); kind names the engine in errors.
func (b *Base) AttachModel(ctx context.Context, cfg Config, kind string) (ServedModel, error) {
	if err := b.Attach(ctx, cfg); err != nil {
		return ServedModel{}, err
	}
	return PickModel(ctx, b.client, cfg.URL, cfg.Model, kind)
}

// Logger is the adapter's logger, naming the engine.
func (b *Base) Logger() *slog.Logger { return b.log }

// Client is the HTTP client requests to the server go through.
func (b *Base) Client() *http.Client { return b.client }

// NewRelay prepares the relay of cfg.Events (none when it is ""), cut at
// blockSize, that SetEventSink starts and Close stops.
func (b *Base) NewRelay(cfg Config, blockSize int) error {
	if cfg.Events == "" {
		return nil
	}
	r, err := NewRelay(RelayConfig{Endpoint: cfg.Events, ReplayEndpoint: cfg.ReplayEvents, Topic: cfg.Topic,
		DPSize: cfg.DPSize, BlockSize: blockSize, Logger: b.log})
	if err != nil {
		return err
	}
	b.relay = r
	return nil
}

// Start records the engine's description and starts the /health poll of
// cfg.URL.
func (b *Base) Start(cfg Config, ecfg engine.Config) {
	b.ecfg, b.statsInterval = ecfg, cfg.StatsInterval
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.health = NewHealthMonitor(HealthConfig{URL: cfg.URL + "/health", Interval: cfg.HealthInterval, Client: b.client, Logger: b.log})
}

// ReadLoad calls scrape every Config.StatsInterval until Close, under
// Context.
func (b *Base) ReadLoad(scrape func(context.Context)) {
	Every(b.ctx, &b.wg, b.statsInterval, scrape)
}

// Context ends at Close: the adapter's background work runs under it.
func (b *Base) Context() context.Context { return b.ctx }

// Go runs f until Close, which waits for it.
func (b *Base) Go(f func()) { b.wg.Go(f) }

// Closed is true once Close was called.
func (b *Base) Closed() bool { return b.closed.Load() }

// Config is the engine's description, as read from the server.
func (b *Base) Config() engine.Config { return b.ecfg }

// Health is the verdict of the /health poll (engine.Health).
func (b *Base) Health() (bool, <-chan struct{}) { return b.health.Health() }

// SetEventSink installs the worker's sink; the first one starts the
// KV-event relay.
func (b *Base) SetEventSink(s engine.EventSink) {
	if b.relay != nil {
		b.relay.SetSink(s)
	}
}

// Inventory lists what rank holds as the relayed KV events built it
// (engine.Inventory), so the worker can answer dumps; false without a
// relay.
func (b *Base) Inventory(rank int, at func()) ([]kv.Event, bool) {
	if b.relay == nil {
		return nil, false
	}
	return b.relay.Inventory(rank, at)
}

// Relay is the KV-event relay, or nil when the engine relays none.
func (b *Base) Relay() *Relay { return b.relay }

// Close stops the load readers, the health poll and the relay; the server
// keeps running.
func (b *Base) Close() error {
	if !b.closed.CompareAndSwap(false, true) {
		return nil
	}
	b.cancel()
	b.wg.Wait()
	b.health.Close()
	var err error
	if b.relay != nil {
		err = b.relay.Close()
	}
	b.client.CloseIdleConnections()
	return err
}

// Ranks is the Base of a server with data-parallel ranks (engine.Ranked),
// whose load is read per rank from its /metrics.
type Ranks struct {
	Base
	dpSize int
	load   RankLoad
}

// Start is Base.Start for cfg.DPSize ranks.
func (r *Ranks) Start(cfg Config, ecfg engine.Config) {
	r.dpSize = cfg.DPSize
	r.Base.Start(cfg, ecfg)
}

// StoreLoad replaces the per-rank load.
func (r *Ranks) StoreLoad(st []engine.Stats) { r.load.Store(st) }

// DPSize is the number of data-parallel ranks behind the server.
func (r *Ranks) DPSize() int { return r.dpSize }

// RankStats is one rank's load as last read.
func (r *Ranks) RankStats(rank int) engine.Stats { return r.load.Rank(rank, r.ecfg.Blocks) }

// Stats sums the ranks' load.
func (r *Ranks) Stats() engine.Stats { return r.load.Sum() }
