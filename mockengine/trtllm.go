package mockengine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/tokenizer"
)

// TRTLLMVersion is what the TensorRT-LLM stand-in's /version reports: the
// release whose trtllm-serve surfaces it follows, with a local label
// naming the mock.
const TRTLLMVersion = "1.2.0+kvmesh.mock"

// TRTLLMOptions is the part of trtllm-serve's LLM API options YAML
// (--extra_llm_api_options / --config) the stand-in reads; every other key
// is accepted and ignored.
type TRTLLMOptions struct {
	KVCacheConfig struct {
		EventBufferMaxSize int   `yaml:"event_buffer_max_size"`
		TokensPerBlock     int   `yaml:"tokens_per_block"`
		EnableBlockReuse   *bool `yaml:"enable_block_reuse"`
	} `yaml:"kv_cache_config"`
	EnableIterPerfStats    bool `yaml:"enable_iter_perf_stats"`
	CacheTransceiverConfig *struct {
		Backend             string `yaml:"backend"`
		KVTransferTimeoutMS int    `yaml:"kv_transfer_timeout_ms"`
	} `yaml:"cache_transceiver_config"`
	KVConnectorConfig *KVConnectorConfig `yaml:"kv_connector_config"`
}

// KVConnectorConfig is TensorRT-LLM's KvCacheConnectorConfig: the Python
// module and the scheduler (leader) and worker classes it loads.
type KVConnectorConfig struct {
	ConnectorModule         string `yaml:"connector_module"`
	ConnectorSchedulerClass string `yaml:"connector_scheduler_class"`
	ConnectorWorkerClass    string `yaml:"connector_worker_class"`
}

// ReadTRTLLMOptions reads an LLM API options YAML file.
func ReadTRTLLMOptions(path string) (*TRTLLMOptions, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var o TRTLLMOptions
	if err := yaml.Unmarshal(b, &o); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &o, nil
}

// TRTLLMConfig configures the TensorRT-LLM stand-in.
type TRTLLMConfig struct {
	// Sim is the engine (one rank): Model is the served model name;
	// BlockSize is tokens_per_block; KVBM, when set, is the KV connector.
	Sim sim.Config
	// MaxSeqLen bounds prompt + output (trtllm-serve's --max_seq_len); 0:
	// the smaller of the KV capacity and 32768.
	MaxSeqLen int
	Tokenizer tokenizer.Tokenizer
	Template  tokenizer.ChatTemplate
	// EventBufferMaxSize is kv_cache_config.event_buffer_max_size: how
	// many KV events wait for POST /kv_cache_events; 0 keeps none (the
	// endpoint answers []), as TensorRT-LLM does. Older events are dropped
	// when it is full.
	EventBufferMaxSize int
	// IterPerfStats is enable_iter_perf_stats: without it /metrics is [].
	IterPerfStats bool
	// Transceiver, when set, serves disaggregated requests
	// (cache_transceiver_config): a context_only request keeps its blocks
	// for the generation server, which pulls them over this side channel.
	Transceiver *TransceiverConfig
	Logger      *slog.Logger
}

// TransceiverConfig is the stand-in's cache transceiver.
type TransceiverConfig struct {
	Host          string        // listened on and named in the opaque state
	Port          int           // 0 picks one
	LeaseDuration time.Duration // how long a context's blocks wait for their generation
	PullTimeout   time.Duration
}

// TRTLLM is the TensorRT-LLM stand-in: serve Handler on an HTTP listener.
type TRTLLM struct {
	core
	cfg    TRTLLMConfig
	mux    *http.ServeMux
	reqSeq atomic.Int64

	evMu        sync.Mutex
	evBuf       []trtEvent
	evNext      int64
	blockTokens map[kv.SeqHash][]kv.Token // with a KV block manager: tokens of blocks its host tier may store

	statMu   sync.Mutex
	lastMark uint64
	statSeen bool
	iter     int64

	recMu   sync.Mutex
	records []DisaggRecord
}

// NewTRTLLM starts the engine and its cache transceiver.
func NewTRTLLM(ctx context.Context, cfg TRTLLMConfig) (*TRTLLM, error) {
	if cfg.Sim.DPSize > 1 {
		return nil, errors.New("the TensorRT-LLM stand-in runs one rank")
	}
	t := &TRTLLM{cfg: cfg}
	if err := t.start(coreConfig{sim: cfg.Sim, maxLen: cfg.MaxSeqLen, maxLenArg: "max_seq_len", tok: cfg.Tokenizer,
		tmpl: cfg.Template, log: cfg.Logger, pulls: cfg.Transceiver != nil}); err != nil {
		return nil, err
	}
	t.cfg.Sim = t.sc
	if cfg.EventBufferMaxSize > 0 {
		t.blockTokens = make(map[kv.SeqHash][]kv.Token)
		t.queueCreated()
		t.eng.SetEventSink(t.sink)
	}
	if tc := cfg.Transceiver; tc != nil {
		if err := t.startHandoffs(handoffConfig{host: tc.Host, port: tc.Port, lease: tc.LeaseDuration, pullTimeout: tc.PullTimeout}); err != nil {
			t.Close()
			return nil, fmt.Errorf("cache transceiver: %w", err)
		}
	}
	t.trtRoutes()
	return t, nil
}

// Handler serves trtllm-serve's HTTP surface.
func (t *TRTLLM) Handler() http.Handler { return t.mux }

// Engine is the simulated engine behind the surface.
func (t *TRTLLM) Engine() *sim.Engine { return t.eng }

// MaxSeqLen is the context length.
func (t *TRTLLM) MaxSeqLen() int { return t.maxLen }

// TransceiverPort is the cache transceiver's port (0 without one).
func (t *TRTLLM) TransceiverPort() int { return t.sidePort(0) }

// LeaseStats is the context side's lease table.
func (t *TRTLLM) LeaseStats() LeaseStats { return t.leaseStats(0) }

// Close stops everything; /health answers 503 afterwards.
func (t *TRTLLM) Close() error {
	_, err := t.stop()
	return err
}
