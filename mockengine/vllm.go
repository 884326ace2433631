package mockengine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/tokenizer"
	"github.com/kvmesh/kvmesh/transfer"
)

// VLLMVersion is what the stand-in's /version reports: the vLLM release
// whose surfaces it follows, with a PEP 440 local label naming the mock.
const VLLMVersion = "0.31.0+kvmesh.mock"

// KV roles of vLLM's --kv-transfer-config.
const (
	RoleProducer = "kv_producer"
	RoleConsumer = "kv_consumer"
	RoleBoth     = "kv_both"
)

// Defaults of vLLM's NixlConnector.
const (
	DefaultSideChannelPort = 5600             // VLLM_NIXL_SIDE_CHANNEL_PORT
	DefaultLeaseDuration   = 30 * time.Second // kv_connector_extra_config.kv_lease_duration
	DefaultPullTimeout     = 5 * time.Second
)

// KVTransferConfig turns on the NixlConnector stand-in (vLLM without
// --kv-transfer-config ignores kv_transfer_params, and so does the mock).
type KVTransferConfig struct {
	Role     string // kv_producer, kv_consumer or kv_both
	EngineID string // remote_engine_id this engine advertises; "" draws one
	// SideChannelHost is where the side channel listens and what
	// remote_host says (VLLM_NIXL_SIDE_CHANNEL_HOST).
	SideChannelHost string
	// SideChannelPort is rank 0's port; rank r listens on it + r. 0 picks
	// free ports (tests).
	SideChannelPort int
	LeaseDuration   time.Duration // how long a prefill's blocks wait for their decode
	PullTimeout     time.Duration // bound on one decode pull
}

// VLLMConfig configures the vLLM stand-in.
type VLLMConfig struct {
	// Sim is the engine: Model is the served model name; BlockSize, Blocks,
	// DPSize, SpeedupRatio and the timing model apply as under `serve`.
	Sim sim.Config
	// MaxModelLen bounds prompt + output tokens (vLLM's --max-model-len);
	// 0 means the smaller of one rank's KV capacity and 32768.
	MaxModelLen int
	// Tokenizer and Template render text; nil means the built-in o200k and
	// ChatML.
	Tokenizer tokenizer.Tokenizer
	Template  tokenizer.ChatTemplate
	// Events, when set, publishes KV events on vLLM's ZMQ wire.
	Events *EventsConfig
	// KVTransfer, when set, serves P/D with the NixlConnector contract.
	KVTransfer *KVTransferConfig
	// EnablePromptTokensDetails reports usage.prompt_tokens_details
	// (vLLM's --enable-prompt-tokens-details).
	EnablePromptTokensDetails bool
	// LoRAs are the adapters served besides Sim.Model (vLLM's
	// --lora-modules names): a request naming one computes in its hash
	// domain.
	LoRAs []string
	// MaxHintRecords bounds the recorded kv_hints (default 1024).
	MaxHintRecords int
	Logger         *slog.Logger
}

// VLLM is the vLLM stand-in: serve Handler on an HTTP listener.
type VLLM struct {
	core
	cfg  VLLMConfig
	mux  *http.ServeMux
	pubs *RankPublishers

	hints hintLog
	stats vllmCounters
}

type vllmCounters struct {
	mu       sync.Mutex
	finished map[[2]string]uint64 // (rank, reason) → requests
}

// NewVLLM starts the engine, its publishers and side channels.
func NewVLLM(ctx context.Context, cfg VLLMConfig) (*VLLM, error) {
	v := &VLLM{cfg: cfg}
	v.stats.finished = make(map[[2]string]uint64)
	v.hints.max = cfg.MaxHintRecords
	if v.hints.max <= 0 {
		v.hints.max = 1024
	}
	if err := v.start(coreConfig{sim: cfg.Sim, maxLen: cfg.MaxModelLen, maxLenArg: "max model len", tok: cfg.Tokenizer,
		tmpl: cfg.Template, log: cfg.Logger, pulls: cfg.KVTransfer != nil}); err != nil {
		return nil, err
	}
	v.cfg.Sim = v.sc
	if cfg.Events != nil {
		var err error
		if v.pubs, err = NewRankPublishers(ctx, *cfg.Events, v.eng.DPSize(), v.sc.BlockSize, v.log); err != nil {
			v.eng.Close()
			return nil, err
		}
		v.eng.SetEventSink(v.pubs.Sink)
	}
	if kt := cfg.KVTransfer; kt != nil {
		switch kt.Role {
		case RoleProducer, RoleConsumer, RoleBoth:
		default:
			v.Close()
			return nil, fmt.Errorf("kv role %q: want %s, %s or %s", kt.Role, RoleProducer, RoleConsumer, RoleBoth)
		}
		if err := v.startHandoffs(handoffConfig{engineID: kt.EngineID, host: kt.SideChannelHost, port: kt.SideChannelPort,
			lease: kt.LeaseDuration, pullTimeout: kt.PullTimeout}); err != nil {
			v.Close()
			return nil, err
		}
	}
	v.routes()
	return v, nil
}

// sideDigest is the transfer digest of a producer's side channel: its
// engine id and KV layout, so a consumer that names another engine or
// another layout is refused, as NIXL's handshake refuses it.
func sideDigest(engineID, layout string) string {
	d := "vllm-mock/" + engineID + "/" + layout
	if len(d) > transfer.MaxDigestLen {
		d = d[:transfer.MaxDigestLen]
	}
	return d
}

// Handler serves vLLM's HTTP surface.
func (v *VLLM) Handler() http.Handler { return v.mux }

// Engine is the simulated engine behind the surface.
func (v *VLLM) Engine() *sim.Engine { return v.eng }

// EngineID is remote_engine_id ("" without a connector).
func (v *VLLM) EngineID() string { return v.engID }

// MaxModelLen is the context length /v1/models reports.
func (v *VLLM) MaxModelLen() int { return v.maxLen }

// SideChannelPort is rank r's side-channel port (0 without a connector).
func (v *VLLM) SideChannelPort(r int) int { return v.sidePort(r) }

// EventsEndpoint and ReplayEndpoint are rank r's bound event endpoints
// ("" without events).
func (v *VLLM) EventsEndpoint(r int) string {
	if v.pubs == nil || r < 0 || r >= len(v.pubs.pubs) {
		return ""
	}
	return v.pubs.pubs[r].Endpoint()
}

func (v *VLLM) ReplayEndpoint(r int) string {
	if v.pubs == nil || r < 0 || r >= len(v.pubs.pubs) {
		return ""
	}
	return v.pubs.pubs[r].ReplayEndpoint()
}

// LeaseStats is rank r's lease table (zero without a connector).
func (v *VLLM) LeaseStats(r int) LeaseStats { return v.leaseStats(r) }

// Close stops everything; /health answers 503 afterwards.
func (v *VLLM) Close() error {
	first, err := v.stop()
	if first && v.pubs != nil {
		err = errors.Join(err, v.pubs.Close())
	}
	return err
}

func (v *VLLM) noteFinish(rank int, reason string) {
	v.stats.mu.Lock()
	v.stats.finished[[2]string{strconv.Itoa(rank), reason}]++
	v.stats.mu.Unlock()
}

// finishName is an OpenAI-style finish_reason; engines name a cancelled
// request differently (vLLM "abort", TensorRT-LLM "cancelled").
func finishName(f kv.FinishReason, cancelled string) string {
	switch f {
	case kv.FinishStop:
		return "stop"
	case kv.FinishLength:
		return "length"
	case kv.FinishCancelled:
		return cancelled
	}
	return "error"
}
