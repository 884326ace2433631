package vllm

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/remote"
)

// Engine drives one vLLM server.
type Engine struct {
	remote.Ranks // per rank, from /metrics
	cfg          Config
	maxModelLen  int
}

var (
	_ engine.Engine    = (*Engine)(nil)
	_ engine.Ranked    = (*Engine)(nil)
	_ engine.Health    = (*Engine)(nil)
	_ engine.Inventory = (*Engine)(nil) // from its relayed events: dumps
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
	if cfg.HintForm, err = cfg.HintForm.WithDefault(); err != nil {
		return nil, fmt.Errorf("vllm hint form %w", err)
	}
	if cfg.Transfer, err = cfg.Transfer.WithDefault(); err != nil {
		return nil, fmt.Errorf("vllm kv transfer %w", err)
	}
	e := &Engine{cfg: cfg}
	m, err := e.AttachModel(ctx, cfg.Config, "vllm")
	if err != nil {
		return nil, err
	}
	e.cfg.Model, e.maxModelLen = m.ID, m.MaxModelLen
	blockSize, blocks, err := e.readCacheConfig(ctx)
	if err != nil {
		return nil, err
	}
	cfg = e.cfg
	ecfg := engine.Config{Model: cfg.Model, Role: cfg.Role, BlockSize: blockSize, Blocks: blocks, MaxModelLen: e.maxModelLen,
		// Hints and handoffs only make sense between engines serving the
		// same model with the same block layout.
		Digest: fmt.Sprintf("vllm/%s/bs%d", cfg.Model, blockSize)}
	if err := e.NewRelay(cfg.Config, blockSize); err != nil {
		return nil, err
	}
	e.Start(cfg.Config, ecfg)
	e.scrape(ctx)
	e.ReadLoad(e.scrape)
	e.Logger().Info("vllm engine attached", "model", cfg.Model, "max_model_len", e.maxModelLen, "block_size", blockSize,
		"blocks", blocks, "dp_size", cfg.DPSize, "hint_form", cfg.HintForm, "kv_transfer", cfg.Transfer, "kv_events", cfg.Events)
	return e, nil
}

// readCacheConfig reads block size and KV blocks per rank from
// vllm:cache_config_info; a pinned block size must agree.
func (e *Engine) readCacheConfig(ctx context.Context) (blockSize, blocks int, err error) {
	fams, err := remote.Scrape(ctx, e.Client(), e.cfg.URL+"/metrics")
	if err != nil {
		e.Logger().Warn("vllm engine metrics unreadable; block size and capacity unknown", "err", err)
	}
	for _, s := range remote.Samples(fams, "vllm:cache_config_info") {
		blockSize, _ = strconv.Atoi(s.Labels["block_size"])
		blocks, _ = strconv.Atoi(s.Labels["num_gpu_blocks"])
		break
	}
	blockSize, err = e.SettleBlockSize(blockSize, e.cfg.BlockSize, remote.BlockSizeRule{Default: DefaultBlockSize,
		Engine: "vLLM engine", Uses: "uses blocks of %d tokens", Key: "block_size",
		Unknown: "vllm engine reports no block size (vllm:cache_config_info); assuming vLLM's default"})
	if err != nil {
		return 0, 0, err
	}
	return blockSize, blocks, nil
}

// scrape reads the per-rank load from /metrics (label engine = DP rank).
func (e *Engine) scrape(ctx context.Context) {
	fams, err := remote.Scrape(ctx, e.Client(), e.cfg.URL+"/metrics")
	if err != nil {
		if ctx.Err() == nil {
			e.Logger().Debug("vllm metrics", "err", err)
		}
		return
	}
	usage := "vllm:kv_cache_usage_perc"
	if fams[usage] == nil {
		usage = "vllm:gpu_cache_usage_perc" // vLLM before 0.10
	}
	series := remote.LoadSeries{Running: "vllm:num_requests_running", Waiting: "vllm:num_requests_waiting", Usage: usage}
	e.StoreLoad(remote.ReadRankLoad(fams, e.cfg.DPSize, e.Config().Blocks, series, remote.ModelRank(e.cfg.Model, "engine")))
}

// MaxModelLen is the server's context length (/v1/models).
func (e *Engine) MaxModelLen() int { return e.maxModelLen }

var errNoChoice = errors.New("vllm response without a choice")
