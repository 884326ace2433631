package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/engine/sim/simpeer"
	"github.com/kvmesh/kvmesh/eventplane"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/worker"
)

type workerFlags struct {
	engine, model, role           string
	nats                          natsFlags
	listen, advertise, instanceID string
	controlEndpoints              []string
	loras                         []string
	controlListen, advertiseHost  string
	metricsListen                 string
	transferTimeout               time.Duration
	discoveryTTL, loadInterval    time.Duration
	stallTimeout                  time.Duration
	ringSize, dpSize              int
	logLevel                      string
	sim                           sim.Config
	kvbm                          kvbmFlags
	connectorOut                  string
	real                          realEngineFlags // --engine vllm etc.
	kvcr                          kvcrFlags
	realOpts                      engineOpts
	fleet                         fleetFlags
	tls                           tlsFlags
}

func newWorkerCmd() *cobra.Command {
	wf := &workerFlags{sim: sim.DefaultConfig()}
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run one engine as a kvmesh worker (gRPC worker API, discovery, KV events on NATS)",
		Long: `worker starts one engine, serves the worker API over gRPC, registers the instance
in the NATS discovery bucket (refreshed well within its TTL), publishes the engine's
KV events and load on NATS, and answers routers' gap-repair queries. SIGINT or
SIGTERM deregisters and stops it. Every flag has a KVMESH_* environment variable.
OpenTelemetry traces follow the standard OTEL_* variables
(OTEL_EXPORTER_OTLP_ENDPOINT turns them on; off when unset).

On startup it prints one line to stdout:
  kvmesh worker ready instance=<hex id> grpc=<host:port> model=<name>`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runWorker(cmd, wf)
		},
	}
	f := cmd.Flags()
	f.StringVar(&wf.engine, "engine", "sim", "engine to drive: sim, or a running real engine's kind (--engine-url, --kv-events): "+engineKinds()[len("sim, "):])
	f.StringVar(&wf.model, "model", "kvmesh-sim", "model name served and registered")
	f.StringVar(&wf.role, "role", "aggregated", "aggregated, prefill or decode")
	wf.nats.register(f)
	f.StringVar(&wf.listen, "listen", "127.0.0.1:0", "gRPC listen address")
	f.StringVar(&wf.advertise, "advertise", "", "gRPC address to register (default: the bound listen address)")
	f.StringVar(&wf.instanceID, "instance-id", "", "instance id in hex (default: random)")
	f.StringSliceVar(&wf.loras, "lora", nil, "LoRA adapters the engine serves, by the names requests use as their model (vLLM's --lora-modules names); registered in discovery, each its own KV hash domain")
	f.StringSliceVar(&wf.controlEndpoints, "control-endpoints", nil, "peer KV transfer endpoints tcp://host:port, one per DP rank, when served by something else")
	f.StringVar(&wf.controlListen, "control-listen", "", "serve this worker's KV blocks to peers on host:port (rank r on port+r; port 0: ephemeral) and fetch hinted blocks from peers")
	f.StringVar(&wf.advertiseHost, "advertise-host", "", "host peers dial for the control endpoints (required with --control-listen; 0.0.0.0 and :: are rejected)")
	f.DurationVar(&wf.transferTimeout, "transfer-timeout", time.Second, "per-fetch timeout of a hinted peer KV transfer")
	f.StringVar(&wf.metricsListen, "metrics-listen", "", "serve Prometheus /metrics and the probes /live and /health (Kubernetes) on this address (empty: off)")
	f.DurationVar(&wf.discoveryTTL, "discovery-ttl", discovery.MaxTTL, "discovery record TTL (1s..10s; set by the first process to create the bucket)")
	f.DurationVar(&wf.loadInterval, "load-interval", time.Second, "how often load is published")
	registerStallTimeout(f, &wf.stallTimeout)
	f.IntVar(&wf.ringSize, "event-ring", eventplane.DefaultRingSize, "recent KV events kept per DP rank for gap repair")
	f.IntVar(&wf.dpSize, "dp-size", 1, "data-parallel ranks the engine serves (sim: one engine per rank, each with --blocks blocks, its own load and KV events)")
	f.StringVar(&wf.logLevel, "log-level", "info", "debug, info, warn or error")
	wf.fleet.register(f)
	wf.tls.register(f)
	// Simulated engine.
	s := &wf.sim
	f.IntVar(&s.BlockSize, "block-size", s.BlockSize, "sim: tokens per KV block")
	f.IntVar(&s.Blocks, "blocks", s.Blocks, "sim: device KV capacity in blocks")
	f.IntVar(&s.MaxBatchedTokens, "max-batched-tokens", s.MaxBatchedTokens, "sim: token budget per scheduler step")
	f.IntVar(&s.MaxSeqs, "max-seqs", s.MaxSeqs, "sim: running sequences per step")
	f.Float64Var(&s.Watermark, "watermark", s.Watermark, "sim: fraction of blocks kept free when admitting")
	f.Float64Var(&s.SpeedupRatio, "speedup-ratio", s.SpeedupRatio, "sim: divide modelled time by this (0: no waiting)")
	f.DurationVar(&s.Disagg.TTL, "disagg-handoff-ttl", sim.DefaultHandoffTTL, "sim, --role prefill: how long a prefill answer's blocks stay pinned when no decode worker reads them")
	f.Float64Var(&s.DecodeSpeedupRatio, "decode-speedup-ratio", s.DecodeSpeedupRatio, "sim: extra divisor for decode time")
	f.IntVar(&s.Layers, "layers", s.Layers, "sim: payload layers per block")
	f.IntVar(&s.PayloadSize, "payload-size", s.PayloadSize, "sim: payload bytes per block and layer")
	addKVBMFlags(f, &wf.kvbm)
	addKVBMSidecarFlags(f, &wf.kvbm)
	f.StringVar(&wf.connectorOut, "connector-config-out", "", "real engine with --connector: write the engine-side configuration that loads the connector (trtllm: the --extra_llm_api_options YAML naming kvmesh_kvbm.trtllm; vllm: the --kv-transfer-config JSON naming kvmesh_kvbm.vllm) to this file ('-': stdout); it is logged either way")
	registerWorkerEngineFlags(f, &wf.real, &wf.realOpts)
	wf.kvcr.register(f)
	cmd.RunE = quietOnInterrupt(cmd.RunE)
	return withEnv(cmd, "")
}

// registerStallTimeout defines --stall-timeout (worker and serve).
func registerStallTimeout(f *pflag.FlagSet, d *time.Duration) {
	f.DurationVar(d, "stall-timeout", worker.DefaultStallTimeout, "a worker whose engine produces nothing this long with streams in flight leaves discovery and fails its streams so they migrate (0: off)")
}

// stallTimeoutConfig maps the flag (0: off) to worker.Config (0: default, negative: off).
func stallTimeoutConfig(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}

func workerLogger(level string, w *os.File) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}

func runWorker(cmd *cobra.Command, wf *workerFlags) error {
	log, err := workerLogger(wf.logLevel, os.Stderr)
	if err != nil {
		return err
	}
	if err := checkSimFlags(wf.sim); err != nil {
		return err
	}
	fleetToken, err := wf.fleet.token()
	if err != nil {
		return err
	}
	tracer, stopTracing, err := setupTracing(cmd.Context(), "kvmesh-worker", log)
	if err != nil {
		return err
	}
	defer stopTracing()
	serverTLS, clientTLS, err := wf.tls.configs()
	if err != nil {
		return err
	}
	if err := checkInts(intFlag{"dp-size", int64(wf.dpSize), 1}); err != nil {
		return err
	}
	if err := wf.kvcr.check(cmd.Flags(), wf.engine, &wf.dpSize, wf.real.peers); err != nil {
		return err
	}
	if err := checkStallTimeout(wf.stallTimeout); err != nil {
		return err
	}
	role, err := kv.ParseRole(wf.role)
	if err != nil {
		return fmt.Errorf("--role: %w", err)
	}
	if err := refuseIgnoredFlags(cmd.Flags(), flagUse{command: "worker", engine: wf.engine, role: role, connector: wf.kvbm.connector}); err != nil {
		return err
	}
	if err := wf.kvbm.checkFor(wf.engine, role); err != nil {
		return err
	}
	var id uint64
	if wf.instanceID != "" {
		id, err = strconv.ParseUint(strings.TrimPrefix(wf.instanceID, "0x"), 16, 64)
		if err != nil || id == 0 {
			return fmt.Errorf("--instance-id %q: want a non-zero hex number", wf.instanceID)
		}
	}
	if role == kv.RolePrefill && wf.engine == "sim" && wf.controlListen == "" {
		return errors.New("--role prefill needs --control-listen (and --advertise-host): decode workers pull the prompt's KV from it")
	}
	if wf.sim.Disagg.TTL <= 0 {
		return fmt.Errorf("--disagg-handoff-ttl %v: want > 0", wf.sim.Disagg.TTL)
	}
	if id == 0 {
		// Picked here: the disk tier's file and the NATS identity are
		// named by the instance.
		id = randomInstanceID()
	}
	if wf.controlListen != "" && len(wf.controlEndpoints) > 0 {
		return errors.New("--control-listen and --control-endpoints: set one (served here, or elsewhere)")
	}
	if wf.advertiseHost != "" && wf.controlListen == "" {
		return errors.New("--advertise-host names the host peers dial for --control-listen; without it nothing is advertised")
	}
	if wf.controlListen != "" && wf.advertiseHost == "" {
		return errors.New("--control-listen needs --advertise-host: the host peers dial (a wildcard bind address cannot be advertised)")
	}
	if wf.advertiseHost != "" {
		if _, err := kv.NewEndpoint(wf.advertiseHost, 1); err != nil {
			return fmt.Errorf("--advertise-host: %w", err)
		}
	}
	if err := checkLoRAFlag(wf.loras, wf.model); err != nil {
		return err
	}
	for i, ep := range wf.controlEndpoints {
		if _, err := kv.ParseEndpoint(ep); err != nil {
			return fmt.Errorf("--control-endpoints (rank %d): %w", i, err)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// The metrics listener serves from the start (a busy port fails before
	// the engine loads): /live answers while the engine starts, so a slow
	// start is not a liveness failure; /health once the worker registered.
	var health atomic.Pointer[http.Handler] // the worker's probes, once it runs
	if wf.metricsListen != "" {
		ln, err := net.Listen("tcp", wf.metricsListen)
		if err != nil {
			return fmt.Errorf("--metrics-listen %s: %w", wf.metricsListen, err)
		}
		msrv := &http.Server{Handler: workerHTTP(reg, &health), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = msrv.Serve(ln) }()
		defer msrv.Close()
		log.Info("metrics", "addr", ln.Addr().String())
	}
	var eng engine.Engine
	var peer *worker.Peer
	var acceptsHints *bool
	var sources []worker.EventSource
	var sidecarSource worker.EventSource // a real engine's connector tiers' events
	noEvents := false
	switch wf.engine {
	case "sim":
		if wf.connectorOut != "" {
			return errors.New("--connector-config-out is for a real engine, which loads the connector itself; the sim runs --connector kvbm in-process")
		}
		cfg := wf.sim
		cfg.OutputTokens = simOutputTokens()
		cfg.Model, cfg.Role, cfg.DPSize = wf.model, role, wf.dpSize
		cfg.Worker.Instance = id
		cfg.KVBM = wf.kvbm.sim()
		// A decode worker pulls its prompts' KV over the transfer client
		// even when it serves none.
		if wf.controlListen != "" || role == kv.RoleDecode {
			pm, err := worker.NewPeerMetrics(reg)
			if err != nil {
				return err
			}
			faultAdvertise, err := faultControlAdvertise()
			if err != nil {
				return err
			}
			s, p, err := newSimPeer(cfg, worker.PeerConfig{Listen: wf.controlListen, AdvertiseHost: wf.advertiseHost,
				Timeout: wf.transferTimeout, Metrics: pm, Logger: log, Token: fleetToken, ServerTLS: serverTLS, ClientTLS: clientTLS,
				FaultAdvertise: faultAdvertise})
			if err != nil {
				return fmt.Errorf("sim engine: %w", err)
			}
			eng, peer = s, p
		} else {
			s, err := sim.New(cfg)
			if err != nil {
				return fmt.Errorf("sim engine: %w", err)
			}
			eng = s
		}
	default:
		model := wf.model
		if !cmd.Flags().Changed("model") {
			model = "" // the engine's
		}
		if err := emitConnectorConfig(cmd, wf, role, log); err != nil {
			return err
		}
		if wf.kvbm.connector != "" {
			// Before the engine: it registers its KV cache with the
			// sidecar as it starts.
			sc, err := wf.kvbm.startSidecar(id, log)
			if err != nil {
				return err
			}
			defer sc.Close()
			sidecarSource = sidecarEvents{sc}
			if err := registerKVBMMetrics(reg, sidecarStats(sc), wf.model, id); err != nil {
				return err
			}
		}
		ve, err := startRealWorkerEngine(cmd, wf, model, role, log)
		if err != nil {
			return err
		}
		if err := registerRelayMetrics(reg, ve); err != nil {
			ve.Close()
			return err
		}
		eng = ve
		wf.model, wf.controlEndpoints, acceptsHints = eng.Config().Model, wf.real.peers, wf.realOpts.acceptsHints()
		if wf.kvcr.on {
			agent, err := wf.kvcr.attach(cmd.Context(), wf.engine, wf.real.url, eng.Config().BlockSize, log)
			if err == nil {
				err = registerKVCRMetrics(reg, agent)
			}
			if err != nil {
				if agent != nil {
					agent.Close()
				}
				eng.Close()
				return err
			}
			if agent != nil {
				defer agent.Close()
				// Validated: the linker's endpoints, every DP rank's, and
				// its inventory beside the engine's own events.
				wf.controlEndpoints, sources = wf.kvcr.endpoints, []worker.EventSource{agent}
			} else {
				// No capability: no endpoints, no hints; the engine still serves.
				off := false
				wf.controlEndpoints, acceptsHints = nil, &off
			}
		}
		if noEvents = wf.real.events == "" && sources == nil; noEvents {
			warnNoEvents(log, wf.engine)
		}
		if sidecarSource != nil {
			sources = append(sources, sidecarSource)
		}
	}
	if s, ok := eng.(*sim.Engine); ok && wf.kvbm.connector != "" {
		if err := registerKVBMMetrics(reg, s.KVBMStats, wf.model, id); err != nil {
			eng.Close()
			return err
		}
		if st := s.KVBMStats(); st.RecoveredDisk > 0 || st.RecoveredObject > 0 || st.RecoveredCorrupt > 0 {
			log.Info("kvbm tiers recovered", "disk_blocks", st.RecoveredDisk, "object_blocks", st.RecoveredObject, "corrupt_dropped", st.RecoveredCorrupt, "dir", wf.kvbm.dir, "object_url", wf.kvbm.objURL)
		}
	}

	if err := wf.nats.identify(fleetToken, natsbus.WorkerIdentity(id)); err != nil {
		eng.Close()
		return err
	}
	nc, err := wf.nats.connect("kvmesh-worker "+wf.model, log)
	if err != nil {
		eng.Close()
		return err
	}
	defer nc.Close()

	w, err := worker.New(worker.Config{
		Model: wf.model, Role: role, ListenAddr: wf.listen, AdvertiseAddr: wf.advertise, InstanceID: id,
		DPSize: wf.dpSize, RingSize: wf.ringSize, LoadInterval: wf.loadInterval, StallTimeout: stallTimeoutConfig(wf.stallTimeout), ControlEndpoints: wf.controlEndpoints, AcceptsHints: acceptsHints, LoRAs: wf.loras, EventSources: sources, Peer: peer, Registerer: reg,
		FleetToken: fleetToken, TLS: serverTLS, Tracer: tracer, Engine: wf.engine, DecodeOnly: decodeOnly(wf.engine, role), NoKVEvents: noEvents,
		Discovery: discovery.Config{TTL: wf.discoveryTTL, Logger: log}, Logger: log,
	}, eng, nc)
	if err != nil {
		eng.Close()
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = w.Start(sctx)
	cancel()
	if err != nil {
		w.Close()
		return err
	}
	h := w.HealthHandler()
	health.Store(&h)
	fmt.Fprintf(cmd.OutOrStdout(), "kvmesh worker ready instance=%s grpc=%s model=%s\n", natsbus.InstanceToken(w.InstanceID()), w.Addr(), wf.model)
	<-ctx.Done()
	log.Info("shutting down")
	if err := w.Close(); err != nil {
		return err
	}
	if err := nc.Drain(); err != nil {
		// NATS away at shutdown: nothing is left that waiting would save.
		log.Warn("NATS drain at shutdown", "err", err)
	}
	return nil
}

// workerHTTP is the worker's metrics listener: /metrics, and /live and
// /health for Kubernetes probes (worker.HealthHandler) once the worker
// runs; before that /live is 200 (starting) and /health 503.
func workerHTTP(reg *prometheus.Registry, health *atomic.Pointer[http.Handler]) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	probe := func(w http.ResponseWriter, r *http.Request) {
		if h := health.Load(); h != nil {
			(*h).ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/health" {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"status":"unavailable","reason":"worker starting"}`+"\n")
			return
		}
		io.WriteString(w, `{"status":"live"}`+"\n")
	}
	mux.HandleFunc("GET /live", probe)
	mux.HandleFunc("GET /health", probe)
	return mux
}

func init() { rootCmd.AddCommand(newWorkerCmd()) }

// faultControlAdvertiseEnv is a fault-injection hook, never a flag: the
// control endpoints to advertise instead of the bound ones (one per DP
// rank, comma-separated), so peers reach this worker through a proxy that
// corrupts or stalls the stream (the chaos suite; docs/reliability.md).
const faultControlAdvertiseEnv = "KVMESH_FAULT_CONTROL_ADVERTISE"

func faultControlAdvertise() ([]string, error) {
	v := os.Getenv(faultControlAdvertiseEnv)
	if v == "" {
		return nil, nil
	}
	eps := strings.Split(v, ",")
	for i, ep := range eps {
		if _, err := kv.ParseEndpoint(ep); err != nil {
			return nil, fmt.Errorf("%s (rank %d): %w", faultControlAdvertiseEnv, i, err)
		}
	}
	return eps, nil
}

// newSimPeer starts a sim engine whose peer side is a new worker.Peer of pc.
func newSimPeer(cfg sim.Config, pc worker.PeerConfig) (*sim.Engine, *worker.Peer, error) {
	return worker.StartWithPeer(pc, func(p *worker.Peer) (*sim.Engine, error) { return simpeer.New(cfg, p) })
}
