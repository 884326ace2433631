package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/events"
	"github.com/kvmesh/kvmesh/mockengine"
)

// mockEngineCmd groups the stand-ins for real engines.
var mockEngineCmd = &cobra.Command{
	Use:   "mock-engine",
	Short: "Run the simulated engine behind a real engine's network surfaces (no GPU)",
	RunE:  groupRun,
}

type mockVLLMFlags struct {
	host, model, servedName  string
	loras                    []string
	port                     int
	sim                      sim.Config
	dpSize, maxModelLen      int
	eventsEP, replayEP       string
	eventsTopic, eventFormat string
	eventsConfig             string
	kvRole, transferConfig   string
	engineID                 string
	sideHost                 string
	sidePort                 int
	lease, pullTimeout       time.Duration
	promptDetails            bool
	prefixCaching            bool
	logLevel                 string
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

func envString(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func newMockVLLMCmd() *cobra.Command {
	mf := &mockVLLMFlags{sim: sim.DefaultConfig()}
	mf.sim.BlockSize = 16 // vLLM's default
	cmd := &cobra.Command{
		Use:   "vllm [MODEL]",
		Short: "A vLLM stand-in: OpenAI API, KV events on ZMQ, NixlConnector P/D, on the simulated engine",
		Long: `vllm serves the simulated engine behind vLLM's surfaces:

  POST /v1/completions, /v1/chat/completions  (return_token_ids, cache_salt, stream_options,
       kv_transfer_params, kv_hints; vLLM's error shape)
  GET  /v1/models (max_model_len), /health, /version, /load, /metrics (vllm:* names)
  GET  /debug/kv_hints   the kv_hints envelopes received (mock only)

KV events: --kv-events-endpoint binds a ZMQ PUB (rank r on port+r), --kv-events-replay-endpoint
a ROUTER for replay; --event-format map (vLLM now, the default) or array (older vLLM). vLLM's own
--kv-events-config JSON is accepted too, and then vLLM's rule applies: an endpoint with "*" or
"::" binds, any other connects.

P/D: --kv-role (or vLLM's --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":...}')
turns on the NixlConnector contract: a request with kv_transfer_params.do_remote_decode answers
with the handoff parameters and leases its prompt blocks; a request carrying them pulls the blocks'
bytes from the producer's side channel (--side-channel-port + rank, VLLM_NIXL_SIDE_CHANNEL_PORT)
and notifies it; a lease no decode consumes expires after --kv-lease-duration.

Timing is the sim's (Dynamo's mocker polynomial), divided by --speedup-ratio.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := positionalModel(cmd, args, &mf.model); err != nil {
				return err
			}
			return runMockVLLM(cmd, mf)
		},
	}
	f := cmd.Flags()
	f.StringVar(&mf.host, "host", "127.0.0.1", "HTTP listen host")
	f.IntVar(&mf.port, "port", 8000, "HTTP listen port (vLLM's default 8000)")
	f.StringVar(&mf.model, "model", "kvmesh-sim", "model name (vLLM's positional MODEL works too)")
	f.StringVar(&mf.servedName, "served-model-name", "", "name served in the API (default: --model)")
	f.IntVar(&mf.maxModelLen, "max-model-len", 0, "context length (0: min(blocks × block size, 32768))")
	f.IntVar(&mf.dpSize, "data-parallel-size", 1, "data-parallel ranks, each its own sim engine, event stream and side channel")
	s := &mf.sim
	f.IntVar(&s.BlockSize, "block-size", s.BlockSize, "tokens per KV block (vLLM's default 16)")
	f.IntVar(&s.Blocks, "blocks", s.Blocks, "KV capacity in blocks per rank")
	f.IntVar(&s.Blocks, "num-gpu-blocks-override", s.Blocks, "vLLM's name for --blocks")
	f.IntVar(&s.MaxBatchedTokens, "max-num-batched-tokens", s.MaxBatchedTokens, "token budget per scheduler step")
	f.IntVar(&s.MaxSeqs, "max-num-seqs", s.MaxSeqs, "running sequences per step")
	f.Float64Var(&s.SpeedupRatio, "speedup-ratio", s.SpeedupRatio, "divide modelled time by this (0: no waiting)")
	f.Float64Var(&s.DecodeSpeedupRatio, "decode-speedup-ratio", s.DecodeSpeedupRatio, "extra divisor for decode time")
	f.StringVar(&mf.eventsEP, "kv-events-endpoint", "", "bind a ZMQ PUB for KV events here, e.g. tcp://127.0.0.1:5557 (empty: no events)")
	f.StringVar(&mf.replayEP, "kv-events-replay-endpoint", "", "bind a ZMQ ROUTER for replay here, e.g. tcp://127.0.0.1:5558")
	f.StringVar(&mf.eventsTopic, "kv-events-topic", "", "ZMQ topic of the events")
	f.StringVar(&mf.eventFormat, "event-format", "map", "map (vLLM's current encoding), array (older vLLM) or map-events")
	f.StringVar(&mf.eventsConfig, "kv-events-config", "", "vLLM's KV events JSON, e.g. '{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:5557\"}'")
	f.StringVar(&mf.kvRole, "kv-role", "", "kv_producer, kv_consumer or kv_both: turn on the NixlConnector contract")
	f.StringVar(&mf.transferConfig, "kv-transfer-config", "", "vLLM's KV transfer JSON, e.g. '{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_both\"}'")
	f.StringVar(&mf.engineID, "engine-id", "", "remote_engine_id this engine advertises (default: kv-transfer-config's, else random)")
	f.StringVar(&mf.sideHost, "side-channel-host", envString("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1"), "side channel host, bound and advertised as remote_host [VLLM_NIXL_SIDE_CHANNEL_HOST]")
	f.IntVar(&mf.sidePort, "side-channel-port", envInt("VLLM_NIXL_SIDE_CHANNEL_PORT", mockengine.DefaultSideChannelPort), "side channel port of rank 0; rank r uses port+r [VLLM_NIXL_SIDE_CHANNEL_PORT]")
	f.DurationVar(&mf.lease, "kv-lease-duration", 0, "how long a prefill's blocks wait for their decode (default 30s, or kv-transfer-config's kv_lease_duration)")
	f.DurationVar(&mf.pullTimeout, "kv-pull-timeout", mockengine.DefaultPullTimeout, "bound on one decode pull")
	f.BoolVar(&mf.promptDetails, "enable-prompt-tokens-details", true, "report usage.prompt_tokens_details.cached_tokens (vLLM's default is off; the mock's on)")
	f.BoolVar(&mf.prefixCaching, "enable-prefix-caching", true, "accepted for vLLM command lines; the sim always caches prefixes")
	f.StringSliceVar(&mf.loras, "lora-modules", nil, "LoRA adapters served under their own names, as NAME or vLLM's NAME=PATH (the path is ignored): a request naming one computes, caches and reports KV events in its hash domain (lora_name)")
	f.StringVar(&mf.logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}

func runMockVLLM(cmd *cobra.Command, mf *mockVLLMFlags) error {
	log, err := workerLogger(mf.logLevel, os.Stderr)
	if err != nil {
		return err
	}
	if err := checkSimFlags(mf.sim); err != nil {
		return err
	}
	if err := checkInts(intFlag{"data-parallel-size", int64(mf.dpSize), 1}, intFlag{"max-model-len", int64(mf.maxModelLen), 0},
		intFlag{"port", int64(mf.port), 0}, intFlag{"side-channel-port", int64(mf.sidePort), 0}); err != nil {
		return err
	}
	if !mf.prefixCaching {
		return errors.New("--enable-prefix-caching=false: the sim always caches prefixes")
	}
	cfg := mockengine.VLLMConfig{Sim: mf.sim, MaxModelLen: mf.maxModelLen, EnablePromptTokensDetails: mf.promptDetails, Logger: log}
	for _, m := range mf.loras {
		name, _, _ := strings.Cut(m, "=")
		if err := discovery.ValidLoRAName(name); err != nil || slices.Contains(cfg.LoRAs, name) {
			return fmt.Errorf("--lora-modules %q: want distinct NAME or NAME=PATH entries (%v)", m, err)
		}
		cfg.LoRAs = append(cfg.LoRAs, name)
	}
	cfg.Sim.Model = mf.model
	if mf.servedName != "" {
		cfg.Sim.Model = mf.servedName
	}
	cfg.Sim.DPSize = mf.dpSize

	// Events: vLLM's JSON, or the mock's own flags (which bind).
	if mf.eventsConfig != "" {
		if mf.eventsEP != "" {
			return errors.New("--kv-events-config and --kv-events-endpoint: give one")
		}
		if cfg.Events, err = mockengine.ParseKVEventsConfig(mf.eventsConfig); err != nil {
			return err
		}
	} else if mf.eventsEP != "" {
		cfg.Events = &mockengine.EventsConfig{Endpoint: mf.eventsEP, ReplayEndpoint: mf.replayEP, BindMode: events.Bind, Topic: mf.eventsTopic}
	} else if mf.replayEP != "" {
		return errors.New("--kv-events-replay-endpoint needs --kv-events-endpoint")
	}
	if cfg.Events != nil {
		if cfg.Events.Shape, err = events.ParseShape(mf.eventFormat); err != nil {
			return fmt.Errorf("--event-format: %w", err)
		}
		if cmd.Flags().Changed("kv-events-topic") {
			cfg.Events.Topic = mf.eventsTopic
		}
	}

	// P/D: vLLM's JSON, with the mock's flags on top.
	var kt *mockengine.KVTransferConfig
	if mf.transferConfig != "" {
		if kt, err = mockengine.ParseKVTransferConfig(mf.transferConfig); err != nil {
			return err
		}
	}
	if mf.kvRole != "" {
		if kt == nil {
			kt = &mockengine.KVTransferConfig{}
		}
		kt.Role = mf.kvRole
	}
	if kt != nil {
		if mf.engineID != "" {
			kt.EngineID = mf.engineID
		}
		if mf.lease > 0 {
			kt.LeaseDuration = mf.lease
		}
		kt.SideChannelHost, kt.SideChannelPort, kt.PullTimeout = mf.sideHost, mf.sidePort, mf.pullTimeout
		cfg.KVTransfer = kt
	}

	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	v, err := mockengine.NewVLLM(ctx, cfg)
	if err != nil {
		return fmt.Errorf("mock-engine vllm: %w", err)
	}
	defer v.Close()
	return serveMock(ctx, "vllm", mf.host, mf.port, v.Handler(), func(addr net.Addr) {
		out := cmd.OutOrStdout()
		fmt.Fprintf(out, "kvmesh mock-engine vllm: serving %s on http://%s (max_model_len %d, block size %d, %d blocks × %d ranks)\n",
			cfg.Sim.Model, addr, v.MaxModelLen(), cfg.Sim.BlockSize, cfg.Sim.Blocks, mf.dpSize)
		for r := range mf.dpSize {
			printRankEvents(out, r, v)
			if p := v.SideChannelPort(r); p != 0 {
				fmt.Fprintf(out, "  rank %d: %s engine %s, side channel %s\n", r, kt.Role, v.EngineID(),
					net.JoinHostPort(kt.SideChannelHost, strconv.Itoa(p)))
			}
		}
	})
}

func init() {
	mockEngineCmd.AddCommand(withEnv(newMockVLLMCmd(), "MOCK_VLLM_"))
	rootCmd.AddCommand(mockEngineCmd)
}

// serveMock serves a mock engine's handler on host:port until ctx ends;
// banner prints what it serves once it listens.
func serveMock(ctx context.Context, name, host string, port int, h http.Handler, banner func(addr net.Addr)) error {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("mock-engine %s: --port: %w", name, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	banner(ln.Addr())
	select {
	case err := <-errc:
		return fmt.Errorf("mock-engine %s: %w", name, err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return nil
}

// printRankEvents prints where DP rank r publishes its KV events.
func printRankEvents(out io.Writer, r int, eps interface {
	EventsEndpoint(rank int) string
	ReplayEndpoint(rank int) string
}) {
	ep := eps.EventsEndpoint(r)
	if ep == "" {
		return
	}
	fmt.Fprintf(out, "  rank %d: kv events %s", r, ep)
	if rep := eps.ReplayEndpoint(r); rep != "" {
		fmt.Fprintf(out, ", replay %s", rep)
	}
	fmt.Fprintln(out)
}

// positionalModel takes the engine CLI's positional MODEL (vllm serve
// MODEL, trtllm-serve MODEL) into model, refusing a different --model.
func positionalModel(cmd *cobra.Command, args []string, model *string) error {
	if len(args) == 0 {
		return nil
	}
	if cmd.Flags().Changed("model") && args[0] != *model {
		return fmt.Errorf("model given twice: %q and --model %q", args[0], *model)
	}
	*model = args[0]
	return nil
}
