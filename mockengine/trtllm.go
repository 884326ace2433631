package mockengine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/tokenizer"
	"github.com/kvmesh/kvmesh/transfer"
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
	cfg       TRTLLMConfig
	log       *slog.Logger
	eng       *sim.Engine
	tok       tokenizer.Tokenizer
	tmpl      tokenizer.ChatTemplate
	eos       []kv.Token
	maxSeqLen int
	created   int64
	mux       *http.ServeMux

	leases *Leases
	side   *SideChannel
	client *transfer.Client
	engID  string
	digest string
	pulls  sync.Map
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

	closed atomic.Bool
	pull   PullStats
	pullMu sync.Mutex
}

// NewTRTLLM starts the engine and its cache transceiver.
func NewTRTLLM(ctx context.Context, cfg TRTLLMConfig) (*TRTLLM, error) {
	t := &TRTLLM{cfg: cfg, log: cfg.Logger, tok: cfg.Tokenizer, tmpl: cfg.Template, created: time.Now().Unix()}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	if t.tok == nil || t.tmpl == nil {
		tok, tmpl, err := tokenizer.Builtin()
		if err != nil {
			return nil, err
		}
		if t.tok == nil {
			t.tok = tok
		}
		if t.tmpl == nil {
			t.tmpl = tmpl
		}
	}
	for _, s := range []string{"<|endoftext|>", "<|im_end|>"} {
		if id, ok := t.tok.TokenID(s); ok {
			t.eos = append(t.eos, id)
		}
	}
	sc := cfg.Sim
	if sc.DPSize > 1 {
		return nil, errors.New("the TensorRT-LLM stand-in runs one rank")
	}
	if sc.VocabSize == 0 {
		sc.VocabSize = t.tok.VocabSize()
	}
	sc.StoreChecksums = true
	if sc.Layers == 0 {
		sc.Layers = sim.DefaultLayers
	}
	if sc.PayloadSize == 0 {
		sc.PayloadSize = sim.DefaultPayloadSize
	}
	if cfg.Transceiver != nil {
		sc.Fetcher = t.fetch
	}
	eng, err := sim.New(sc)
	if err != nil {
		return nil, err
	}
	t.eng = eng
	t.cfg.Sim = eng.SimConfig()
	sc = t.cfg.Sim
	t.digest = sc.Digest
	capTokens := sc.Blocks * sc.BlockSize
	t.maxSeqLen = cfg.MaxSeqLen
	if t.maxSeqLen <= 0 {
		t.maxSeqLen = min(capTokens, 32768)
	}
	if t.maxSeqLen > capTokens {
		eng.Close()
		return nil, fmt.Errorf("max_seq_len %d exceeds the KV capacity of %d tokens (%d blocks of %d)", t.maxSeqLen, capTokens, sc.Blocks, sc.BlockSize)
	}
	if cfg.EventBufferMaxSize > 0 {
		t.blockTokens = make(map[kv.SeqHash][]kv.Token)
		t.queueCreated()
		eng.SetEventSink(t.sink)
	}
	if tc := cfg.Transceiver; tc != nil {
		if tc.Host == "" {
			tc.Host = "127.0.0.1"
		}
		if tc.LeaseDuration <= 0 {
			tc.LeaseDuration = DefaultLeaseDuration
		}
		if tc.PullTimeout <= 0 {
			tc.PullTimeout = DefaultPullTimeout
		}
		t.engID = randomHex(16)
		t.client = transfer.NewClient(transfer.ClientOptions{Timeout: tc.PullTimeout})
		t.leases = NewLeases(eng, sc.Layers, sc.PayloadSize, tc.LeaseDuration)
		t.side, err = ServeSideChannel(net.JoinHostPort(tc.Host, strconv.Itoa(tc.Port)), t.leases, sideDigest(t.engID, t.digest), t.log)
		if err != nil {
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
func (t *TRTLLM) MaxSeqLen() int { return t.maxSeqLen }

// TransceiverPort is the cache transceiver's port (0 without one).
func (t *TRTLLM) TransceiverPort() int {
	if t.side == nil {
		return 0
	}
	return t.side.Port()
}

// LeaseStats is the context side's lease table.
func (t *TRTLLM) LeaseStats() LeaseStats {
	if t.leases == nil {
		return LeaseStats{}
	}
	return t.leases.Stats()
}

// PullStats counts the generation side's pulls.
func (t *TRTLLM) PullStats() PullStats {
	t.pullMu.Lock()
	defer t.pullMu.Unlock()
	return t.pull
}

// Close stops everything; /health answers 503 afterwards.
func (t *TRTLLM) Close() error {
	if t.closed.Swap(true) {
		return nil
	}
	var errs []error
	if t.side != nil {
		errs = append(errs, t.side.Close())
	}
	if t.leases != nil {
		t.leases.Close()
	}
	errs = append(errs, t.eng.Close())
	if t.client != nil {
		errs = append(errs, t.client.Close())
	}
	return errors.Join(errs...)
}
