package mockengine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
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
	cfg         VLLMConfig
	log         *slog.Logger
	eng         *sim.Engine
	tok         tokenizer.Tokenizer
	tmpl        tokenizer.ChatTemplate
	eos         []kv.Token
	maxModelLen int
	created     int64
	mux         *http.ServeMux

	pubs   *RankPublishers
	leases []*Leases
	sides  []*SideChannel
	client *transfer.Client
	engID  string
	digest string // the sim's layout digest; the side channel's is sideDigest(engID)
	pulls  sync.Map

	hints hintLog

	closed atomic.Bool
	stats  vllmCounters
}

type vllmCounters struct {
	mu       sync.Mutex
	finished map[[2]string]uint64 // (rank, reason) → requests

	pullOK, pullFailed, pullNotHeld, pullBlocks, notified, notifyFailed, localHits atomic.Uint64
}

// NewVLLM starts the engine, its publishers and side channels.
func NewVLLM(ctx context.Context, cfg VLLMConfig) (*VLLM, error) {
	v := &VLLM{cfg: cfg, log: cfg.Logger, tok: cfg.Tokenizer, tmpl: cfg.Template, created: time.Now().Unix()}
	if v.log == nil {
		v.log = slog.New(slog.DiscardHandler)
	}
	if v.tok == nil || v.tmpl == nil {
		tok, tmpl, err := tokenizer.Builtin()
		if err != nil {
			return nil, err
		}
		if v.tok == nil {
			v.tok = tok
		}
		if v.tmpl == nil {
			v.tmpl = tmpl
		}
	}
	for _, s := range []string{"<|endoftext|>", "<|im_end|>"} {
		if id, ok := v.tok.TokenID(s); ok {
			v.eos = append(v.eos, id)
		}
	}
	v.stats.finished = make(map[[2]string]uint64)
	v.hints.max = cfg.MaxHintRecords
	if v.hints.max <= 0 {
		v.hints.max = 1024
	}

	sc := cfg.Sim
	if sc.VocabSize == 0 {
		sc.VocabSize = v.tok.VocabSize()
	}
	sc.StoreChecksums = true
	if sc.Layers == 0 {
		sc.Layers = sim.DefaultLayers
	}
	if sc.PayloadSize == 0 {
		sc.PayloadSize = sim.DefaultPayloadSize
	}
	if cfg.KVTransfer != nil {
		sc.Fetcher = v.fetch
	}
	eng, err := sim.New(sc)
	if err != nil {
		return nil, err
	}
	v.eng = eng
	v.cfg.Sim = eng.SimConfig()
	sc = v.cfg.Sim
	v.digest = sc.Digest
	v.maxModelLen = cfg.MaxModelLen
	capTokens := sc.Blocks * sc.BlockSize
	if v.maxModelLen <= 0 {
		v.maxModelLen = min(capTokens, 32768)
	}
	if v.maxModelLen > capTokens {
		eng.Close()
		return nil, fmt.Errorf("max model len %d exceeds one rank's KV capacity of %d tokens (%d blocks of %d)",
			v.maxModelLen, capTokens, sc.Blocks, sc.BlockSize)
	}
	ranks := eng.DPSize()
	if cfg.Events != nil {
		if v.pubs, err = NewRankPublishers(ctx, *cfg.Events, ranks, sc.BlockSize, v.log); err != nil {
			eng.Close()
			return nil, err
		}
		eng.SetEventSink(v.pubs.Sink)
	}
	if kt := cfg.KVTransfer; kt != nil {
		if err := v.startConnector(kt, ranks); err != nil {
			v.Close()
			return nil, err
		}
	}
	v.routes()
	return v, nil
}

func (v *VLLM) startConnector(kt *KVTransferConfig, ranks int) error {
	switch kt.Role {
	case RoleProducer, RoleConsumer, RoleBoth:
	default:
		return fmt.Errorf("kv role %q: want %s, %s or %s", kt.Role, RoleProducer, RoleConsumer, RoleBoth)
	}
	if kt.SideChannelHost == "" {
		kt.SideChannelHost = "127.0.0.1"
	}
	if kt.LeaseDuration <= 0 {
		kt.LeaseDuration = DefaultLeaseDuration
	}
	if kt.PullTimeout <= 0 {
		kt.PullTimeout = DefaultPullTimeout
	}
	v.engID = kt.EngineID
	if v.engID == "" {
		v.engID = randomHex(16)
	}
	v.client = transfer.NewClient(transfer.ClientOptions{Timeout: kt.PullTimeout})
	sc := v.cfg.Sim
	for r := range ranks {
		l := NewLeases(v.eng.Rank(r), sc.Layers, sc.PayloadSize, kt.LeaseDuration)
		v.leases = append(v.leases, l)
		port := 0
		if kt.SideChannelPort > 0 {
			port = kt.SideChannelPort + r
		}
		s, err := ServeSideChannel(net.JoinHostPort(kt.SideChannelHost, strconv.Itoa(port)), l, sideDigest(v.engID, v.digest), v.log)
		if err != nil {
			return fmt.Errorf("side channel of rank %d: %w", r, err)
		}
		v.sides = append(v.sides, s)
	}
	return nil
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

func randomHex(n int) string {
	b := make([]byte, (n+1)/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)[:n]
}

// Handler serves vLLM's HTTP surface.
func (v *VLLM) Handler() http.Handler { return v.mux }

// Engine is the simulated engine behind the surface.
func (v *VLLM) Engine() *sim.Engine { return v.eng }

// EngineID is remote_engine_id ("" without a connector).
func (v *VLLM) EngineID() string { return v.engID }

// MaxModelLen is the context length /v1/models reports.
func (v *VLLM) MaxModelLen() int { return v.maxModelLen }

// SideChannelPort is rank r's side-channel port (0 without a connector).
func (v *VLLM) SideChannelPort(r int) int {
	if r < 0 || r >= len(v.sides) {
		return 0
	}
	return v.sides[r].Port()
}

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
func (v *VLLM) LeaseStats(r int) LeaseStats {
	if r < 0 || r >= len(v.leases) {
		return LeaseStats{}
	}
	return v.leases[r].Stats()
}

// PullStats counts the decode side's pulls.
type PullStats struct {
	OK, Failed     uint64 // pulls that delivered what the producer held / that failed
	NotHeld        uint64 // pulls the producer answered with no block: the lease ended, or its blocks are of another cache_salt (also in Failed)
	Blocks         uint64 // blocks pulled and inserted
	LocalHits      uint64 // decodes whose prompt was all cached here: notify only
	Notified       uint64 // notifications the producer acknowledged
	NotifyFailures uint64
}

// PullStats returns the decode-side counters.
func (v *VLLM) PullStats() PullStats {
	s := &v.stats
	return PullStats{OK: s.pullOK.Load(), Failed: s.pullFailed.Load(), NotHeld: s.pullNotHeld.Load(), Blocks: s.pullBlocks.Load(),
		LocalHits: s.localHits.Load(), Notified: s.notified.Load(), NotifyFailures: s.notifyFailed.Load()}
}

// Close stops everything; /health answers 503 afterwards.
func (v *VLLM) Close() error {
	if v.closed.Swap(true) {
		return nil
	}
	var errs []error
	for _, s := range v.sides {
		errs = append(errs, s.Close())
	}
	for _, l := range v.leases {
		l.Close()
	}
	errs = append(errs, v.eng.Close())
	if v.pubs != nil {
		errs = append(errs, v.pubs.Close())
	}
	if v.client != nil {
		errs = append(errs, v.client.Close())
	}
	return errors.Join(errs...)
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
