package trtllm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/remote"
)

// Engine drives one trtllm-serve.
type Engine struct {
	remote.Base
	cfg Config

	stats     atomic.Pointer[engine.Stats]
	finished  atomic.Uint64 // generations that ended, for the event-buffer hint
	sizeWarn  atomic.Bool
	bufWarned atomic.Bool

	sink    atomic.Pointer[engine.EventSink]
	evMu    sync.Mutex // guards conv's stats for readers
	conv    *converter
	started atomic.Bool
}

var (
	_ engine.Engine = (*Engine)(nil)
	_ engine.Health = (*Engine)(nil)
)

// iterStats is one entry of /metrics: TensorRT-LLM's iteration stats.
type iterStats struct {
	NumActiveRequests int `json:"numActiveRequests"`
	NumQueuedRequests int `json:"numQueuedRequests"`
	KVCacheStats      *struct {
		MaxNumBlocks   int     `json:"maxNumBlocks"`
		UsedNumBlocks  int     `json:"usedNumBlocks"`
		TokensPerBlock int     `json:"tokensPerBlock"`
		CacheHitRate   float64 `json:"cacheHitRate"`
	} `json:"kvCacheStats"`
}

// New waits until the server is healthy (bounded by ctx), reads its model
// from /v1/models and its block size and KV capacity from /metrics, and
// starts reading its load. Polling KV events starts when the worker
// installs its event sink.
func New(ctx context.Context, cfg Config) (*Engine, error) {
	var err error
	if cfg.Config, err = cfg.WithDefaults("trtllm"); err != nil {
		return nil, err
	}
	if cfg.DPSize > 1 {
		return nil, fmt.Errorf("trtllm DP size %d: a TensorRT-LLM server is one rank to kvmesh", cfg.DPSize)
	}
	if cfg.ReplayEvents != "" || cfg.Topic != "" {
		return nil, errors.New("trtllm kv events are polled over HTTP: no ZMQ replay endpoint or topic")
	}
	if cfg.Events != "" {
		if cfg.Events, err = remote.CheckURL(cfg.Events); err != nil {
			return nil, fmt.Errorf("trtllm kv events: %w", err)
		}
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 100 * time.Millisecond
	}
	if cfg.EventsHintAfter <= 0 {
		cfg.EventsHintAfter = 8
	}
	e := &Engine{cfg: cfg}
	m, err := e.AttachModel(ctx, cfg.Config, "trtllm")
	if err != nil {
		return nil, err
	}
	e.cfg.Model = m.ID
	last, err := e.readStats(ctx)
	if err != nil {
		e.Logger().Warn("trtllm /metrics unreadable; block size and capacity unknown", "err", err)
	}
	blockSize, blocks := 0, 0
	if last != nil && last.KVCacheStats != nil {
		blockSize, blocks = last.KVCacheStats.TokensPerBlock, last.KVCacheStats.MaxNumBlocks
	}
	blockSize, err = e.SettleBlockSize(blockSize, cfg.BlockSize, remote.BlockSizeRule{Default: DefaultBlockSize,
		Engine: "TensorRT-LLM engine", Uses: "uses blocks of %d tokens", Key: "block_size",
		Unknown: "trtllm engine reports no tokensPerBlock yet (its /metrics is empty until it has iterated; enable_iter_perf_stats); assuming TensorRT-LLM's default"})
	if err != nil {
		return nil, err
	}
	cfg = e.cfg
	e.conv = newConverter(blockSize)
	e.Start(cfg.Config, engine.Config{Model: cfg.Model, Role: cfg.Role, BlockSize: blockSize, Blocks: blocks,
		Digest: fmt.Sprintf("trtllm/%s/bs%d", cfg.Model, blockSize)})
	if last != nil {
		e.apply(last)
	}
	e.ReadLoad(e.scrape)
	e.Logger().Info("trtllm engine attached", "model", cfg.Model, "block_size", blockSize, "blocks", blocks, "kv_events", cfg.Events)
	return e, nil
}

// readStats drains /metrics and returns the newest entry (nil when the
// engine ran no iteration since the last read).
func (e *Engine) readStats(ctx context.Context) (*iterStats, error) {
	var list []iterStats
	if err := remote.GetJSON(ctx, e.Client(), e.cfg.URL+"/metrics", &list); err != nil {
		return nil, err
	}
	if len(list) == 0 {
		return nil, nil
	}
	return &list[len(list)-1], nil
}

// scrape reads the load. /metrics hands out the iteration stats queued
// since the last read: none means the engine ran no iteration, so nothing
// is running or waiting (the KV usage stays as last reported).
func (e *Engine) scrape(ctx context.Context) {
	last, err := e.readStats(ctx)
	if err != nil {
		if ctx.Err() == nil {
			e.Logger().Debug("trtllm metrics", "err", err)
		}
		return
	}
	if last == nil {
		st := e.Stats()
		st.Running, st.Waiting = 0, 0
		e.stats.Store(&st)
		return
	}
	e.apply(last)
}

func (e *Engine) apply(s *iterStats) {
	st := engine.Stats{Running: s.NumActiveRequests, Waiting: s.NumQueuedRequests, TotalBlocks: e.Config().Blocks}
	if k := s.KVCacheStats; k != nil {
		st.UsedBlocks = k.UsedNumBlocks
		if k.MaxNumBlocks > 0 {
			st.TotalBlocks = k.MaxNumBlocks
		}
		if k.TokensPerBlock != 0 && k.TokensPerBlock != e.Config().BlockSize && e.sizeWarn.CompareAndSwap(false, true) {
			e.Logger().Error("the TensorRT-LLM engine's tokensPerBlock differs from this worker's block size; KV events and routing will not match (pin --block-size to the engine's)",
				"engine_block_size", k.TokensPerBlock, "block_size", e.Config().BlockSize)
		}
	}
	e.stats.Store(&st)
}

// Stats is the load as last read from /metrics.
func (e *Engine) Stats() engine.Stats {
	if p := e.stats.Load(); p != nil {
		return *p
	}
	return engine.Stats{TotalBlocks: e.Config().Blocks}
}

// SetEventSink installs the worker's sink; the first one starts polling
// the engine's KV events (with Config.Events set).
func (e *Engine) SetEventSink(s engine.EventSink) {
	if s == nil {
		e.sink.Store(nil)
		return
	}
	e.sink.Store(&s)
	if e.cfg.Events == "" || e.Closed() || !e.started.CompareAndSwap(false, true) {
		return
	}
	e.Go(e.poll)
}

// poll drains POST /kv_cache_events every PollInterval, converts the
// events and hands them to the sink.
func (e *Engine) poll() {
	t := time.NewTicker(e.cfg.PollInterval)
	defer t.Stop()
	url := e.cfg.Events + "/kv_cache_events"
	failing := false
	for {
		body, err := e.post(url)
		switch {
		case err != nil && e.Context().Err() != nil:
			return
		case err != nil:
			if !failing {
				e.Logger().Warn("polling TensorRT-LLM's KV events failed; retrying", "url", url, "err", err)
			}
			failing = true
		default:
			failing = false
			e.evMu.Lock()
			evs, cerr := e.conv.batch(body)
			e.evMu.Unlock()
			if cerr != nil {
				e.Logger().Warn("bad KV events from TensorRT-LLM", "err", cerr)
			}
			if len(evs) > 0 {
				if p := e.sink.Load(); p != nil {
					(*p)(evs)
				}
			}
			e.checkBuffer()
		}
		select {
		case <-e.Context().Done():
			return
		case <-t.C:
		}
	}
}

func (e *Engine) post(url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(e.Context(), http.MethodPost, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := e.Client().Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, remote.ResponseError(resp)
	}
	return io.ReadAll(io.LimitReader(resp.Body, 256<<20))
}

// checkBuffer says, once, that the engine's event buffer is off when it
// has finished generations but never returned a single event (not even
// the "created" event an engine with events on sends first).
func (e *Engine) checkBuffer() {
	if e.finished.Load() < uint64(e.cfg.EventsHintAfter) || e.bufWarned.Load() {
		return
	}
	e.evMu.Lock()
	saw := e.conv.sawAny
	e.evMu.Unlock()
	if !saw && e.bufWarned.CompareAndSwap(false, true) {
		e.Logger().Error("TensorRT-LLM returns no KV events: set kv_cache_config.event_buffer_max_size > 0 (and enable_block_reuse) in the engine's --extra_llm_api_options YAML; until then routing sees none of its cache",
			"url", e.cfg.Events+"/kv_cache_events", "generations", e.finished.Load())
	}
}

// EventsMissing is true once the adapter concluded the engine's event
// buffer is off (see Config.EventsHintAfter).
func (e *Engine) EventsMissing() bool { return e.bufWarned.Load() }

// EventStats counts the polled events like a ZMQ relay's (kvmesh_kv_event_relay_*).
func (e *Engine) EventStats() remote.RelayStats {
	if e.conv == nil {
		return remote.RelayStats{}
	}
	e.evMu.Lock()
	defer e.evMu.Unlock()
	return e.conv.stats
}

var errNoChoice = errors.New("trtllm response without a choice")

// isNull is true for an absent or null JSON value.
func isNull(raw []byte) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}
