package vllm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/remote"
)

// Engine drives one vLLM server.
type Engine struct {
	cfg         Config
	ecfg        engine.Config
	log         *slog.Logger
	client      *http.Client
	maxModelLen int
	relay       *remote.Relay
	health      *remote.HealthMonitor

	load   remote.RankLoad // per rank, from /metrics
	closed atomic.Bool
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

var (
	_ engine.Engine = (*Engine)(nil)
	_ engine.Ranked = (*Engine)(nil)
	_ engine.Health = (*Engine)(nil)
)

// New waits until the server is healthy (bounded by ctx), reads its model
// and context length from /v1/models and its block size and KV capacity
// from /metrics, and starts reading its load. The KV-event relay starts
// when the worker installs its event sink.
func New(ctx context.Context, cfg Config) (*Engine, error) {
	var err error
	if cfg.Config, err = cfg.WithDefaults("vllm"); err != nil {
		return nil, err
	}
	base := cfg.URL
	if cfg.HintForm, err = cfg.HintForm.WithDefault(); err != nil {
		return nil, fmt.Errorf("vllm hint form %w", err)
	}
	e := &Engine{cfg: cfg, client: cfg.Client, log: cfg.Logger.With("engine", base)}
	if err := remote.WaitHealthy(ctx, e.client, base+"/health"); err != nil {
		return nil, err
	}
	m, err := remote.PickModel(ctx, e.client, base, cfg.Model, "vllm")
	if err != nil {
		return nil, err
	}
	e.cfg.Model, e.maxModelLen = m.ID, m.MaxModelLen
	blockSize, blocks, err := e.readCacheConfig(ctx)
	if err != nil {
		return nil, err
	}
	cfg = e.cfg
	e.ecfg = engine.Config{Model: cfg.Model, Role: cfg.Role, BlockSize: blockSize, Blocks: blocks, MaxModelLen: e.maxModelLen,
		// Hints and handoffs only make sense between engines serving the
		// same model with the same block layout.
		Digest: fmt.Sprintf("vllm/%s/bs%d", cfg.Model, blockSize)}
	if cfg.Events != "" {
		e.relay, err = remote.NewRelay(remote.RelayConfig{Endpoint: cfg.Events, ReplayEndpoint: cfg.ReplayEvents, Topic: cfg.Topic,
			DPSize: cfg.DPSize, BlockSize: blockSize, Logger: e.log})
		if err != nil {
			return nil, err
		}
	}
	sctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	e.health = remote.NewHealthMonitor(remote.HealthConfig{URL: base + "/health", Interval: cfg.HealthInterval, Client: e.client, Logger: e.log})
	e.scrape(ctx)
	remote.Every(sctx, &e.wg, cfg.StatsInterval, e.scrape)
	e.log.Info("vllm engine attached", "model", cfg.Model, "max_model_len", e.maxModelLen, "block_size", blockSize,
		"blocks", blocks, "dp_size", cfg.DPSize, "hint_form", cfg.HintForm, "kv_events", cfg.Events)
	return e, nil
}

// readCacheConfig reads block size and KV blocks per rank from
// vllm:cache_config_info; a pinned block size must agree.
func (e *Engine) readCacheConfig(ctx context.Context) (blockSize, blocks int, err error) {
	fams, err := remote.Scrape(ctx, e.client, e.cfg.URL+"/metrics")
	if err != nil {
		e.log.Warn("vllm engine metrics unreadable; block size and capacity unknown", "err", err)
	}
	for _, s := range remote.Samples(fams, "vllm:cache_config_info") {
		blockSize, _ = strconv.Atoi(s.Labels["block_size"])
		blocks, _ = strconv.Atoi(s.Labels["num_gpu_blocks"])
		break
	}
	switch pinned := e.cfg.BlockSize; {
	case blockSize == 0 && pinned == 0:
		blockSize = DefaultBlockSize
		e.log.Warn("vllm engine reports no block size (vllm:cache_config_info); assuming vLLM's default", "block_size", blockSize)
	case blockSize == 0:
		blockSize = pinned
	case pinned != 0 && pinned != blockSize:
		return 0, 0, fmt.Errorf("--block-size %d but the vLLM engine at %s uses blocks of %d tokens", pinned, e.cfg.URL, blockSize)
	}
	return blockSize, blocks, nil
}

// scrape reads the per-rank load from /metrics (label engine = DP rank).
func (e *Engine) scrape(ctx context.Context) {
	fams, err := remote.Scrape(ctx, e.client, e.cfg.URL+"/metrics")
	if err != nil {
		if ctx.Err() == nil {
			e.log.Debug("vllm metrics", "err", err)
		}
		return
	}
	usage := "vllm:kv_cache_usage_perc"
	if fams[usage] == nil {
		usage = "vllm:gpu_cache_usage_perc" // vLLM before 0.10
	}
	series := remote.LoadSeries{Running: "vllm:num_requests_running", Waiting: "vllm:num_requests_waiting", Usage: usage}
	e.load.Store(remote.ReadRankLoad(fams, e.cfg.DPSize, e.ecfg.Blocks, series, remote.ModelRank(e.cfg.Model, "engine")))
}

// Config is the engine's description (model and block size from the
// server).
func (e *Engine) Config() engine.Config { return e.ecfg }

// MaxModelLen is the server's context length (/v1/models).
func (e *Engine) MaxModelLen() int { return e.maxModelLen }

// DPSize is the number of data-parallel ranks behind the server.
func (e *Engine) DPSize() int { return e.cfg.DPSize }

// RankStats is one rank's load as last read from /metrics.
func (e *Engine) RankStats(rank int) engine.Stats { return e.load.Rank(rank, e.ecfg.Blocks) }

// Stats sums the ranks' load.
func (e *Engine) Stats() engine.Stats { return e.load.Sum() }

// Health is the verdict of the /health poll (engine.Health).
func (e *Engine) Health() (bool, <-chan struct{}) { return e.health.Health() }

// SetEventSink installs the worker's sink; the first one starts the
// KV-event relay.
func (e *Engine) SetEventSink(s engine.EventSink) {
	if e.relay != nil {
		e.relay.SetSink(s)
	}
}

// Relay is the KV-event relay, or nil without --kv-events.
func (e *Engine) Relay() *remote.Relay { return e.relay }

// Close stops the load reader and the relay; the server keeps running.
func (e *Engine) Close() error {
	if !e.closed.CompareAndSwap(false, true) {
		return nil
	}
	e.cancel()
	e.wg.Wait()
	e.health.Close()
	var err error
	if e.relay != nil {
		err = e.relay.Close()
	}
	e.client.CloseIdleConnections()
	return err
}

var errNoChoice = errors.New("vllm response without a choice")
