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
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/mockengine"
)

type mockTRTLLMFlags struct {
	host, model, options string
	port, maxSeqLen      int
	sim                  sim.Config
	eventBuffer          int
	iterStats            bool
	transceiver          bool
	transceiverHost      string
	transceiverPort      int
	lease, pullTimeout   time.Duration
	kvbm                 kvbmFlags
	logLevel             string
}

func newMockTRTLLMCmd() *cobra.Command {
	mf := &mockTRTLLMFlags{sim: sim.DefaultConfig()}
	mf.sim.BlockSize = 32 // TensorRT-LLM's tokens_per_block
	cmd := &cobra.Command{
		Use:   "trtllm [MODEL]",
		Short: "A TensorRT-LLM stand-in: trtllm-serve's API, polled KV events, context/generation disaggregation, KVBM, on the simulated engine",
		Long: `trtllm serves the simulated engine behind trtllm-serve's surfaces:

  POST /v1/completions, /v1/chat/completions  (token-id or text prompts, detokenize, stream_options,
       stop_token_ids, disaggregated_params; fields CompletionRequest lacks refused as TensorRT-LLM
       refuses them; its flat error shape)
  GET  /v1/models, /health, /version
  GET  /metrics           the iteration stats queued since the last read, as JSON (enable_iter_perf_stats)
  POST /kv_cache_events   the KV events queued since the last read (kv_cache_config.event_buffer_max_size;
                          0 keeps none, as TensorRT-LLM)
  GET  /debug/disaggregated_params  the parameters context answers carried and generation requests
                          received (mock only)

--extra_llm_api_options (or --config) reads trtllm-serve's YAML: kv_cache_config.event_buffer_max_size
and tokens_per_block, enable_iter_perf_stats, cache_transceiver_config (turns on disaggregation) and
kv_connector_config (turns on the KV block manager, sized by --kvbm-host-blocks); flags given on the
command line win.

Disaggregation: a context_only request computes the prompt and its first token and answers with
disaggregated_params whose encoded_opaque_state names its leased blocks; a generation_only request
carrying them pulls the blocks from the context server's cache transceiver (--transceiver-port),
verifies them, frees the lease and generates on; a lease nobody pulls runs out (--kv-lease-duration).

Timing is the sim's (Dynamo's mocker polynomial), divided by --speedup-ratio.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := positionalModel(cmd, args, &mf.model); err != nil {
				return err
			}
			return runMockTRTLLM(cmd, mf)
		},
	}
	f := cmd.Flags()
	f.StringVar(&mf.host, "host", "127.0.0.1", "HTTP listen host")
	f.IntVar(&mf.port, "port", 8000, "HTTP listen port (trtllm-serve's default 8000)")
	f.StringVar(&mf.model, "model", "kvmesh-sim", "model name (trtllm-serve's positional MODEL works too)")
	f.StringVar(&mf.options, "extra_llm_api_options", "", "trtllm-serve's LLM API options YAML")
	f.StringVar(&mf.options, "config", "", "the same YAML (trtllm-serve's newer name)")
	f.IntVar(&mf.maxSeqLen, "max_seq_len", 0, "context length (0: min(blocks × tokens per block, 32768))")
	s := &mf.sim
	f.IntVar(&s.BlockSize, "tokens-per-block", s.BlockSize, "tokens per KV block (kv_cache_config.tokens_per_block)")
	f.IntVar(&s.Blocks, "blocks", s.Blocks, "KV capacity in blocks")
	f.IntVar(&s.MaxBatchedTokens, "max_num_tokens", s.MaxBatchedTokens, "token budget per iteration")
	f.IntVar(&s.MaxSeqs, "max_batch_size", s.MaxSeqs, "requests per iteration")
	f.Float64Var(&s.SpeedupRatio, "speedup-ratio", s.SpeedupRatio, "divide modelled time by this (0: no waiting)")
	f.Float64Var(&s.DecodeSpeedupRatio, "decode-speedup-ratio", s.DecodeSpeedupRatio, "extra divisor for decode time")
	f.IntVar(&mf.eventBuffer, "kv-event-buffer-max-size", 0, "kv_cache_config.event_buffer_max_size: KV events kept for POST /kv_cache_events (0: none, TensorRT-LLM's default)")
	f.BoolVar(&mf.iterStats, "enable-iter-perf-stats", false, "enable_iter_perf_stats: /metrics reports iteration stats (off: [], TensorRT-LLM's default)")
	f.BoolVar(&mf.transceiver, "cache-transceiver", false, "serve context_only/generation_only requests (as cache_transceiver_config does)")
	f.StringVar(&mf.transceiverHost, "transceiver-host", "127.0.0.1", "cache transceiver host, bound and named in the opaque state")
	f.IntVar(&mf.transceiverPort, "transceiver-port", 0, "cache transceiver port (0: any free one)")
	f.DurationVar(&mf.lease, "kv-lease-duration", mockengine.DefaultLeaseDuration, "how long a context's blocks wait for their generation")
	f.DurationVar(&mf.pullTimeout, "kv-pull-timeout", mockengine.DefaultPullTimeout, "bound on one generation pull")
	addKVBMFlags(f, &mf.kvbm)
	f.StringVar(&mf.logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}

func runMockTRTLLM(cmd *cobra.Command, mf *mockTRTLLMFlags) error {
	log, err := workerLogger(mf.logLevel, os.Stderr)
	if err != nil {
		return err
	}
	fl := cmd.Flags()
	if mf.options != "" {
		o, err := mockengine.ReadTRTLLMOptions(mf.options)
		if err != nil {
			return fmt.Errorf("--extra_llm_api_options: %w", err)
		}
		kc := o.KVCacheConfig
		if !fl.Changed("kv-event-buffer-max-size") {
			mf.eventBuffer = kc.EventBufferMaxSize
		}
		if !fl.Changed("tokens-per-block") && kc.TokensPerBlock != 0 {
			mf.sim.BlockSize = kc.TokensPerBlock
		}
		if kc.EnableBlockReuse != nil && !*kc.EnableBlockReuse {
			return errors.New("--extra_llm_api_options: kv_cache_config.enable_block_reuse false: the sim always reuses blocks")
		}
		if !fl.Changed("enable-iter-perf-stats") {
			mf.iterStats = o.EnableIterPerfStats
		}
		if !fl.Changed("cache-transceiver") && o.CacheTransceiverConfig != nil {
			mf.transceiver = true
		}
		if c := o.KVConnectorConfig; c != nil && mf.kvbm.connector == "" {
			if c.ConnectorModule == "" || c.ConnectorSchedulerClass == "" || c.ConnectorWorkerClass == "" {
				return errors.New("--extra_llm_api_options: kv_connector_config needs connector_module, connector_scheduler_class and connector_worker_class")
			}
			mf.kvbm.connector = "kvbm"
		}
	}
	if err := checkSimFlags(mf.sim); err != nil {
		return err
	}
	if err := checkInts(intFlag{"max_seq_len", int64(mf.maxSeqLen), 0}, intFlag{"port", int64(mf.port), 0},
		intFlag{"kv-event-buffer-max-size", int64(mf.eventBuffer), 0}, intFlag{"transceiver-port", int64(mf.transceiverPort), 0}); err != nil {
		return err
	}
	if err := mf.kvbm.check(kv.RoleAggregated); err != nil {
		return err
	}
	cfg := mockengine.TRTLLMConfig{Sim: mf.sim, MaxSeqLen: mf.maxSeqLen, EventBufferMaxSize: mf.eventBuffer,
		IterPerfStats: mf.iterStats, Logger: log}
	cfg.Sim.Model = mf.model
	cfg.Sim.KVBM = mf.kvbm.sim()
	if cfg.Sim.KVBM != nil {
		cfg.Sim.Worker.Instance = randomInstanceID()
	}
	if mf.transceiver {
		cfg.Transceiver = &mockengine.TransceiverConfig{Host: mf.transceiverHost, Port: mf.transceiverPort,
			LeaseDuration: mf.lease, PullTimeout: mf.pullTimeout}
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	t, err := mockengine.NewTRTLLM(ctx, cfg)
	if err != nil {
		return fmt.Errorf("mock-engine trtllm: %w", err)
	}
	defer t.Close()
	return serveMock(ctx, "trtllm", mf.host, mf.port, t.Handler(), func(addr net.Addr) {
		out := cmd.OutOrStdout()
		fmt.Fprintf(out, "kvmesh mock-engine trtllm: serving %s on http://%s (max_seq_len %d, %d blocks of %d tokens, event buffer %d, iteration stats %v)\n",
			cfg.Sim.Model, addr, t.MaxSeqLen(), cfg.Sim.Blocks, cfg.Sim.BlockSize, mf.eventBuffer, mf.iterStats)
		if p := t.TransceiverPort(); p != 0 {
			fmt.Fprintf(out, "  cache transceiver %s\n", net.JoinHostPort(mf.transceiverHost, strconv.Itoa(p)))
		}
		if k := cfg.Sim.KVBM; k != nil {
			fmt.Fprintf(out, "  kv connector: kvbm, %d host blocks, %d disk blocks\n", k.HostBlocks, k.DiskBlocks)
		}
	})
}

func init() {
	mockEngineCmd.AddCommand(withEnv(newMockTRTLLMCmd(), "MOCK_TRTLLM_"))
}
