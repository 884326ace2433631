package mockengine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/events"
	"github.com/kvmesh/kvmesh/kvcr"
	"github.com/kvmesh/kvmesh/tokenizer"
)

// SGLangVersion is what the SGLang stand-in's /get_server_info reports:
// the SGLang release whose surfaces it follows, with a local label naming
// the mock.
const SGLangVersion = "0.5.6+kvmesh.mock"

// SGLang's --disaggregation-mode values.
const (
	DisaggNull    = "null"
	DisaggPrefill = "prefill"
	DisaggDecode  = "decode"
)

// FakeBootstrapHost is SGLang's stand-in bootstrap host (its health checks
// and the fake transfer backend use it): a decode given it computes the
// prompt itself, a prefill keeps nothing for it.
const FakeBootstrapHost = "2.2.2.2"

// Defaults of SGLang's disaggregation.
const (
	DefaultBootstrapPort    = 8998 // --disaggregation-bootstrap-port
	DefaultBootstrapTimeout = 30 * time.Second
)

// SGLangConfig configures the SGLang stand-in.
type SGLangConfig struct {
	// Sim is the engine: Model is the served model name (SGLang's
	// --served-model-name); BlockSize is the page size (--page-size);
	// Blocks, DPSize, SpeedupRatio and the timing model as under `serve`.
	Sim sim.Config
	// MaxModelLen is the context length (--context-length); 0 means the
	// smaller of one rank's KV capacity and 32768.
	MaxModelLen int
	Tokenizer   tokenizer.Tokenizer
	Template    tokenizer.ChatTemplate
	// Events, when set, publishes KV events on SGLang's ZMQ wire (its
	// Shape is forced to events.ShapeSGLang).
	Events *EventsConfig
	// DisaggMode is --disaggregation-mode: null (aggregated), prefill or
	// decode.
	DisaggMode string
	// BootstrapHost is where a prefill's bootstrap server listens (and the
	// host its side channel advertises); default 127.0.0.1. BootstrapPort
	// is --disaggregation-bootstrap-port (rank r's blocks are served on
	// port + r); 0 picks a free port (tests).
	BootstrapHost string
	BootstrapPort int
	// LeaseDuration bounds how long a prefill keeps a room's KV for its
	// decode; BootstrapTimeout how long a decode waits for its room's
	// prefill.
	LeaseDuration, BootstrapTimeout time.Duration
	// Incremental streams each step's new output_ids and text instead of
	// the cumulative ones (--incremental-streaming-output).
	Incremental    bool
	MaxHintRecords int
	// KVCR, when set, runs the KVCR linker's inventory (kvcr.go): the
	// sim's block-manager tiers (Sim.KVBM) published as inventory and
	// described in /get_server_info as "kvcr_inventory".
	KVCR *KVCRConfig
	// Topology is what /get_server_info reports of the engine's parallel
	// layout; the stand-in runs none of it (zero values report 1).
	Topology ReportedTopology
	Logger   *slog.Logger
}

// ReportedTopology is SGLang's parallel layout as /get_server_info
// reports it (tp_size, pp_size, enable_dp_attention, nnodes,
// tokenizer_worker_num, attn_cp_size); DP is the engine's real one.
type ReportedTopology struct {
	TP, PP, NNodes, TokenizerWorkers, AttnCP int
	AttentionDP                              bool
}

// SGLang is the SGLang stand-in: serve Handler on an HTTP listener. It
// runs the vLLM stand-in's engine, publishers, hint log and P/D machinery
// behind SGLang's surfaces: /generate, /get_server_info, /get_model_info,
// /health, /metrics with SGLang's names, and OpenAI /v1/completions and
// /v1/chat/completions.
type SGLang struct {
	cfg     SGLangConfig
	v       *VLLM
	inv     *KVCRInventory
	log     *slog.Logger
	rooms   rooms
	mux     *http.ServeMux
	created int64
}

// NewSGLang starts the stand-in.
func NewSGLang(ctx context.Context, cfg SGLangConfig) (*SGLang, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	switch cfg.DisaggMode {
	case "":
		cfg.DisaggMode = DisaggNull
	case DisaggNull, DisaggPrefill, DisaggDecode:
	default:
		return nil, fmt.Errorf("disaggregation mode %q: want null, prefill or decode", cfg.DisaggMode)
	}
	if cfg.BootstrapHost == "" {
		cfg.BootstrapHost = "127.0.0.1"
	}
	if cfg.LeaseDuration <= 0 {
		cfg.LeaseDuration = DefaultLeaseDuration
	}
	if cfg.BootstrapTimeout <= 0 {
		cfg.BootstrapTimeout = DefaultBootstrapTimeout
	}
	vc := VLLMConfig{Sim: cfg.Sim, MaxModelLen: cfg.MaxModelLen, Tokenizer: cfg.Tokenizer, Template: cfg.Template,
		EnablePromptTokensDetails: true, MaxHintRecords: cfg.MaxHintRecords, Logger: cfg.Logger}
	if cfg.Events != nil {
		ec := *cfg.Events
		ec.Shape = events.ShapeSGLang
		vc.Events = &ec
	}
	switch cfg.DisaggMode {
	case DisaggPrefill:
		vc.KVTransfer = &KVTransferConfig{Role: RoleProducer, SideChannelHost: cfg.BootstrapHost, SideChannelPort: cfg.BootstrapPort,
			LeaseDuration: cfg.LeaseDuration}
	case DisaggDecode:
		vc.KVTransfer = &KVTransferConfig{Role: RoleConsumer, SideChannelHost: cfg.BootstrapHost, SideChannelPort: cfg.BootstrapPort,
			LeaseDuration: cfg.LeaseDuration}
	}
	// With the linker, the engine's first sink must be the split one: the
	// block manager hands the events it recovered to the first sink.
	evCfg := vc.Events
	if cfg.KVCR != nil {
		vc.Events = nil
	}
	v, err := NewVLLM(ctx, vc)
	if err != nil {
		return nil, err
	}
	s := &SGLang{cfg: cfg, v: v, log: cfg.Logger, created: time.Now().Unix()}
	s.cfg.Sim = v.cfg.Sim
	if cfg.KVCR != nil {
		kc := *cfg.KVCR
		kc.HashDomain = kvcr.HashDomainSGLang
		if s.inv, err = NewKVCRInventory(ctx, kc, v.cfg.Sim.BlockSize, cfg.Logger); err != nil {
			v.Close()
			return nil, err
		}
		var next engine.EventSink
		if evCfg != nil {
			if v.pubs, err = NewRankPublishers(ctx, *evCfg, v.eng.DPSize(), v.cfg.Sim.BlockSize, cfg.Logger); err != nil {
				s.Close()
				return nil, err
			}
			v.cfg.Events, next = evCfg, v.pubs.Sink
		}
		v.eng.SetEventSink(s.inv.Split(next))
	}
	s.cfg.MaxModelLen = v.maxLen
	if cfg.DisaggMode == DisaggPrefill {
		for _, sc := range v.sides {
			sc.SetRooms(s.rooms.lookup)
		}
	}
	s.routes()
	return s, nil
}

// Handler serves SGLang's HTTP surface.
func (s *SGLang) Handler() http.Handler { return s.mux }

// Engine is the simulated engine behind the surface.
func (s *SGLang) Engine() *sim.Engine { return s.v.eng }

// VLLM is the vLLM stand-in whose engine and machinery this one runs.
func (s *SGLang) VLLM() *VLLM { return s.v }

// BootstrapPort is the bootstrap server's port (0 unless prefill or
// decode).
func (s *SGLang) BootstrapPort() int { return s.v.SideChannelPort(0) }

// Hints are the recorded kv_hints and kv_router_hints, oldest first (also
// served at GET /debug/kv_hints).
func (s *SGLang) Hints() []HintRecord { return s.v.Hints() }

// Publishers are the stand-in's per-rank KV-event publishers (SGLang's
// shape), nil without events: a test or an inventory feed can publish
// through them beside the engine.
func (s *SGLang) Publishers() *RankPublishers { return s.v.pubs }

// EventsEndpoint and ReplayEndpoint are rank r's bound event endpoints.
func (s *SGLang) EventsEndpoint(r int) string { return s.v.EventsEndpoint(r) }
func (s *SGLang) ReplayEndpoint(r int) string { return s.v.ReplayEndpoint(r) }

// LeaseStats is rank r's prefill lease table; PullStats the decode side's
// pulls.
func (s *SGLang) LeaseStats(r int) LeaseStats { return s.v.LeaseStats(r) }
func (s *SGLang) PullStats() PullStats        { return s.v.PullStats() }

// KVCRInventory is the linker inventory's publisher, nil without KVCR.
func (s *SGLang) KVCRInventory() *KVCRInventory { return s.inv }

// Close stops everything; /health answers 503 afterwards.
func (s *SGLang) Close() error {
	err := s.v.Close()
	if s.inv != nil {
		err = errors.Join(err, s.inv.Close())
	}
	return err
}

// errClosed is the stand-in's answer once closed.
var errClosed = errors.New("the engine is shut down")
