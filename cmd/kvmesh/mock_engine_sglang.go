package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/events"
	"github.com/kvmesh/kvmesh/kvcr"
	"github.com/kvmesh/kvmesh/mockengine"
)

type mockSGLangFlags struct {
	host, model, servedName string
	port                    int
	sim                     sim.Config
	dpSize, contextLength   int
	maxTotalTokens          int
	eventsEP, replayEP      string
	eventsTopic             string
	eventsConfig            string
	disaggMode              string
	bootstrapHost           string
	bootstrapPort           int
	lease, bootstrapTimeout time.Duration
	incremental             bool
	logLevel                string
	// KVCR linker (SGLang's flags) and the mock's inventory publisher.
	linker             bool
	linkerBackend      string
	extraConfig        string
	kvcrEP, kvcrReplay string
	kvcrOwner          string
	kvcrHost, kvcrDisk int
	kvcrDiskDir        string
	topo               mockengine.ReportedTopology
}

func newMockSGLangCmd() *cobra.Command {
	mf := &mockSGLangFlags{sim: sim.DefaultConfig()}
	mf.sim.BlockSize = 16
	cmd := &cobra.Command{
		Use:   "sglang",
		Short: "An SGLang stand-in: /generate, KV events on ZMQ, bootstrap-room P/D, on the simulated engine",
		Long: `sglang serves the simulated engine behind SGLang's surfaces:

  POST /generate   input_ids or text, sampling_params, stream, rid, cache_salt, routed_dp_rank,
       kv_hints, kv_router_hint, bootstrap_host/port/room; SSE frames {text, output_ids,
       meta_info} with cumulative output (or per-step with --incremental-streaming-output)
  POST /v1/completions, /v1/chat/completions   (OpenAI)
  GET  /get_server_info, /get_model_info, /v1/models, /health, /health_generate, /get_load,
       /metrics (sglang:* names)
  GET  /debug/kv_hints   the kv_hints / kv_router_hints received (mock only)

KV events: SGLang's --kv-events-config '{"publisher":"zmq","endpoint":"tcp://*:5557"}' (rank r on
port+r), or --kv-events-endpoint to bind; batches [ts, events] without a DP rank, hashes signed.

P/D: --disaggregation-mode prefill|decode. A prefill computes the prompt's KV and its first token,
leases the blocks under the request's bootstrap_room and answers the room's decode on
--disaggregation-bootstrap-port (rank r's blocks on port+r); it answers its client once the decode
has pulled them (or --kv-lease-duration ran out). A decode asks bootstrap_host:bootstrap_port for
its room (waiting up to --bootstrap-timeout), pulls the real blocks, and generates.

Timing is the sim's (Dynamo's mocker polynomial), divided by --speedup-ratio.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runMockSGLang(cmd, mf) },
	}
	f := cmd.Flags()
	f.StringVar(&mf.host, "host", "127.0.0.1", "HTTP listen host")
	f.IntVar(&mf.port, "port", 30000, "HTTP listen port (SGLang's default 30000)")
	f.StringVar(&mf.model, "model-path", "kvmesh-sim", "model name (SGLang's --model-path)")
	f.StringVar(&mf.servedName, "served-model-name", "", "name served in the API (default: --model-path)")
	f.IntVar(&mf.contextLength, "context-length", 0, "context length (0: min(blocks × page size, 32768))")
	f.IntVar(&mf.dpSize, "dp-size", 1, "data-parallel ranks, each its own sim engine, event stream and bootstrap port")
	s := &mf.sim
	f.IntVar(&s.BlockSize, "page-size", s.BlockSize, "tokens per KV page, the block of KV events (SGLang's own default is 1)")
	f.IntVar(&s.Blocks, "blocks", s.Blocks, "KV capacity in pages per rank")
	f.IntVar(&mf.maxTotalTokens, "max-total-tokens", 0, "KV capacity in tokens per rank (SGLang's name; overrides --blocks)")
	f.IntVar(&s.MaxBatchedTokens, "chunked-prefill-size", s.MaxBatchedTokens, "token budget per scheduler step")
	f.IntVar(&s.MaxSeqs, "max-running-requests", s.MaxSeqs, "running sequences per step")
	f.Float64Var(&s.SpeedupRatio, "speedup-ratio", s.SpeedupRatio, "divide modelled time by this (0: no waiting)")
	f.Float64Var(&s.DecodeSpeedupRatio, "decode-speedup-ratio", s.DecodeSpeedupRatio, "extra divisor for decode time")
	f.StringVar(&mf.eventsConfig, "kv-events-config", "", `SGLang's KV events JSON, e.g. '{"publisher":"zmq","endpoint":"tcp://*:5557"}'`)
	f.StringVar(&mf.eventsEP, "kv-events-endpoint", "", "bind a ZMQ PUB for KV events here, e.g. tcp://127.0.0.1:5557 (empty: no events)")
	f.StringVar(&mf.replayEP, "kv-events-replay-endpoint", "", "bind a ZMQ ROUTER for replay here, e.g. tcp://127.0.0.1:5558")
	f.StringVar(&mf.eventsTopic, "kv-events-topic", "", "ZMQ topic of the events")
	f.StringVar(&mf.disaggMode, "disaggregation-mode", mockengine.DisaggNull, "null (aggregated), prefill or decode")
	f.StringVar(&mf.bootstrapHost, "disaggregation-bootstrap-host", "127.0.0.1", "host the prefill's bootstrap server binds (mock only)")
	f.IntVar(&mf.bootstrapPort, "disaggregation-bootstrap-port", mockengine.DefaultBootstrapPort, "the prefill's bootstrap port (rank r's blocks on port+r)")
	f.DurationVar(&mf.lease, "kv-lease-duration", mockengine.DefaultLeaseDuration, "how long a prefill keeps a room's KV for its decode")
	f.DurationVar(&mf.bootstrapTimeout, "bootstrap-timeout", mockengine.DefaultBootstrapTimeout, "how long a decode waits for its room's prefill")
	f.BoolVar(&mf.incremental, "incremental-streaming-output", false, "stream each step's new output_ids and text instead of the cumulative ones")
	f.StringVar(&mf.logLevel, "log-level", "info", "debug, info, warn or error")
	f.BoolVar(&mf.linker, "enable-unified-cache-external-linker", false, "run the unified-cache external linker (with --unified-cache-external-linker-backend kvcr: KVCR linker inventory)")
	f.StringVar(&mf.linkerBackend, "unified-cache-external-linker-backend", "", "the linker's backend; the mock knows kvcr")
	f.StringVar(&mf.extraConfig, "hicache-storage-backend-extra-config", "", `KVCR's extra config JSON (or @file), e.g. '{"publish_inventory":true,"kvcr_service_socket_path":null,"advertise_host":"127.0.0.1","control_port":23280}'`)
	f.StringVar(&mf.kvcrEP, "kvcr-inventory-endpoint", "", "kvcr linker: bind the inventory publisher here, e.g. tcp://127.0.0.1:5600 (mock only)")
	f.StringVar(&mf.kvcrReplay, "kvcr-inventory-replay-endpoint", "", "kvcr linker: bind the inventory replay ROUTER here (mock only)")
	f.StringVar(&mf.kvcrOwner, "kvcr-cache-owner", "", "kvcr linker: the cache-owner id reported (default mock-<port>; give a restarted engine the same)")
	f.IntVar(&mf.kvcrHost, "kvcr-host-blocks", 256, "kvcr linker: KVCR DRAM blocks per rank (the sim's host tier, published as CPU)")
	f.IntVar(&mf.kvcrDisk, "kvcr-disk-blocks", 0, "kvcr linker: KVCR G3 blocks per rank (the sim's disk tier, published as STORAGE; needs --kvcr-disk-dir)")
	f.StringVar(&mf.kvcrDiskDir, "kvcr-disk-dir", "", "kvcr linker: directory of the G3 tier's pool files")
	t := &mf.topo
	f.IntVar(&t.TP, "tp-size", 1, "tensor-parallel size reported in /get_server_info (the mock runs one)")
	f.IntVar(&t.PP, "pp-size", 1, "pipeline-parallel size reported (the mock runs one)")
	f.BoolVar(&t.AttentionDP, "enable-dp-attention", false, "attention data parallel, reported only")
	f.IntVar(&t.NNodes, "nnodes", 1, "nodes reported (the mock runs on one)")
	f.IntVar(&t.TokenizerWorkers, "tokenizer-worker-num", 1, "tokenizer workers reported (the mock runs one)")
	f.IntVar(&t.AttnCP, "attn-cp-size", 1, "attention context-parallel size reported (the mock runs one)")
	return cmd
}

// kvcr reads the linker flags: nil when the linker is off.
func (mf *mockSGLangFlags) kvcr(fs interface{ Changed(string) bool }) (*mockengine.KVCRConfig, error) {
	if err := checkInts(intFlag{"tp-size", int64(mf.topo.TP), 1}, intFlag{"pp-size", int64(mf.topo.PP), 1}, intFlag{"nnodes", int64(mf.topo.NNodes), 1},
		intFlag{"tokenizer-worker-num", int64(mf.topo.TokenizerWorkers), 1}, intFlag{"attn-cp-size", int64(mf.topo.AttnCP), 1},
		intFlag{"kvcr-host-blocks", int64(mf.kvcrHost), 0}, intFlag{"kvcr-disk-blocks", int64(mf.kvcrDisk), 0}); err != nil {
		return nil, err
	}
	if !mf.linker {
		for _, name := range []string{"unified-cache-external-linker-backend", "kvcr-inventory-endpoint", "kvcr-inventory-replay-endpoint", "kvcr-cache-owner", "kvcr-host-blocks", "kvcr-disk-blocks", "kvcr-disk-dir"} {
			if fs.Changed(name) {
				return nil, fmt.Errorf("--%s needs --enable-unified-cache-external-linker", name)
			}
		}
		return nil, nil
	}
	if mf.linkerBackend != "kvcr" {
		return nil, fmt.Errorf("--unified-cache-external-linker-backend %q: the mock's linker knows kvcr", mf.linkerBackend)
	}
	lc, err := kvcr.ParseLinkerConfig(mf.extraConfig)
	if err != nil {
		return nil, fmt.Errorf("--hicache-storage-backend-extra-config: %w", err)
	}
	if err := lc.Check(); err != nil {
		return nil, err
	}
	if mf.kvcrEP == "" {
		return nil, errors.New("--enable-unified-cache-external-linker: give --kvcr-inventory-endpoint, where the mock publishes the inventory")
	}
	if mf.kvcrHost == 0 && mf.kvcrDisk == 0 {
		return nil, errors.New("--kvcr-host-blocks 0 --kvcr-disk-blocks 0: KVCR needs a tier")
	}
	if mf.kvcrDisk > 0 && mf.kvcrDiskDir == "" {
		return nil, fmt.Errorf("--kvcr-disk-blocks %d: give --kvcr-disk-dir", mf.kvcrDisk)
	}
	owner := mf.kvcrOwner
	if owner == "" {
		owner = fmt.Sprintf("mock-%d", mf.port)
		if mf.port == 0 {
			owner = fmt.Sprintf("mock-pid%d", os.Getpid())
		}
	}
	mf.sim.KVBM = &sim.KVBMConfig{HostBlocks: mf.kvcrHost, DiskBlocks: mf.kvcrDisk, DiskDir: mf.kvcrDiskDir,
		HostBandwidth: sim.DefaultHostBandwidth, DiskBandwidth: sim.DefaultDiskBandwidth}
	// Every block the host tier keeps goes on to G3: the inventory then
	// shows both tiers from the first request.
	mf.sim.KVBM.DiskFilter.Disabled = true
	return &mockengine.KVCRConfig{Endpoint: mf.kvcrEP, ReplayEndpoint: mf.kvcrReplay, Owner: owner}, nil
}

func runMockSGLang(cmd *cobra.Command, mf *mockSGLangFlags) error {
	log, err := workerLogger(mf.logLevel, os.Stderr)
	if err != nil {
		return err
	}
	if mf.maxTotalTokens > 0 {
		if mf.sim.BlockSize <= 0 {
			return fmt.Errorf("--page-size %d: want > 0", mf.sim.BlockSize)
		}
		mf.sim.Blocks = mf.maxTotalTokens / mf.sim.BlockSize
	}
	if err := checkSimFlags(mf.sim); err != nil {
		return err
	}
	if err := checkInts(intFlag{"dp-size", int64(mf.dpSize), 1}, intFlag{"context-length", int64(mf.contextLength), 0},
		intFlag{"port", int64(mf.port), 0}, intFlag{"disaggregation-bootstrap-port", int64(mf.bootstrapPort), 0},
		intFlag{"max-total-tokens", int64(mf.maxTotalTokens), 0}); err != nil {
		return err
	}
	switch mf.disaggMode {
	case mockengine.DisaggNull, mockengine.DisaggPrefill, mockengine.DisaggDecode:
	default:
		return fmt.Errorf("--disaggregation-mode %q: want null, prefill or decode", mf.disaggMode)
	}
	if mf.lease <= 0 || mf.bootstrapTimeout <= 0 {
		return errors.New("--kv-lease-duration and --bootstrap-timeout: want > 0")
	}
	kc, err := mf.kvcr(cmd.Flags())
	if err != nil {
		return err
	}
	cfg := mockengine.SGLangConfig{Sim: mf.sim, KVCR: kc, Topology: mf.topo, MaxModelLen: mf.contextLength, DisaggMode: mf.disaggMode,
		BootstrapHost: mf.bootstrapHost, BootstrapPort: mf.bootstrapPort, LeaseDuration: mf.lease,
		BootstrapTimeout: mf.bootstrapTimeout, Incremental: mf.incremental, Logger: log}
	cfg.Sim.Model = mf.model
	if mf.servedName != "" {
		cfg.Sim.Model = mf.servedName
	}
	cfg.Sim.DPSize = mf.dpSize
	switch {
	case mf.eventsConfig != "" && mf.eventsEP != "":
		return errors.New("--kv-events-config and --kv-events-endpoint: give one")
	case mf.eventsConfig != "":
		if cfg.Events, err = mockengine.ParseSGLangKVEventsConfig(mf.eventsConfig); err != nil {
			return err
		}
	case mf.eventsEP != "":
		cfg.Events = &mockengine.EventsConfig{Endpoint: mf.eventsEP, ReplayEndpoint: mf.replayEP, BindMode: events.Bind, Topic: mf.eventsTopic}
	case mf.replayEP != "":
		return errors.New("--kv-events-replay-endpoint needs --kv-events-endpoint")
	}
	if cfg.Events != nil && cmd.Flags().Changed("kv-events-topic") {
		cfg.Events.Topic = mf.eventsTopic
	}

	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := mockengine.NewSGLang(ctx, cfg)
	if err != nil {
		return fmt.Errorf("mock-engine sglang: %w", err)
	}
	defer s.Close()
	return serveMock(ctx, "sglang", mf.host, mf.port, s.Handler(), func(addr net.Addr) {
		out := cmd.OutOrStdout()
		fmt.Fprintf(out, "kvmesh mock-engine sglang: serving %s on http://%s (disaggregation-mode %s, page size %d, %d pages × %d ranks)\n",
			cfg.Sim.Model, addr, mf.disaggMode, cfg.Sim.BlockSize, cfg.Sim.Blocks, mf.dpSize)
		for r := range mf.dpSize {
			printRankEvents(out, r, s)
		}
		if inv := s.KVCRInventory(); inv != nil {
			fmt.Fprintf(out, "  kvcr inventory %s", inv.Endpoint())
			if rep := inv.ReplayEndpoint(); rep != "" {
				fmt.Fprintf(out, ", replay %s", rep)
			}
			fmt.Fprintf(out, " (cache owner %s, topic %s)\n", inv.Descriptor().CacheOwner, inv.Descriptor().Topic)
		}
		if p := s.BootstrapPort(); p != 0 {
			fmt.Fprintf(out, "  bootstrap %s\n", net.JoinHostPort(mf.bootstrapHost, strconv.Itoa(p)))
		}
	})
}

func init() { mockEngineCmd.AddCommand(withEnv(newMockSGLangCmd(), "MOCK_SGLANG_")) }
