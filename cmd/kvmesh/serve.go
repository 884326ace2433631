package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/eventplane"
	"github.com/kvmesh/kvmesh/fleet"
	"github.com/kvmesh/kvmesh/frontend"
	"github.com/kvmesh/kvmesh/internal/fleetkey"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/worker"
	"github.com/kvmesh/kvmesh/workerclient"
)

// frontendFlags are shared by `serve` and `frontend`.
type frontendFlags struct {
	listen     string
	models     []string
	routerMode string
	routerCost string
	tierLoadMS string
	// simTierLoad is what serve's simulated workers' tiers cost to load,
	// used when --router-tier-load-ms is not given.
	simTierLoad    router.TierLoad
	temperature    float64
	migrationLimit int
	maxBodyBytes   int64
	maxTokensLimit int
	replicaSync    bool
	busyKVUsage    float64
	hints          bool
	logLevel       string
	tokenizer      string
	// Conditional disaggregation (models with prefill and decode workers).
	localPrefillTokens int
	localPrefillRatio  float64
	// ln is --listen bound early (serve checks the port before starting
	// anything else); nil: startFrontendOn binds it.
	ln net.Listener
	// timeouts bound slow clients at the front door.
	timeouts frontend.Timeouts
	auth     authFlags
	fleet    fleetFlags
	tls      tlsFlags
	queue    queueFlags
	// tracer traces requests when OTEL_* asks for it (tracing.go); nil: off.
	tracer trace.Tracer
	// local are serve's own workers, called in process unless workerGRPC.
	local      []workerclient.Local
	workerGRPC bool
	// localEvents carries those workers' KV events to the frontend's
	// feeds in process (nil with workerGRPC: over NATS, as remote ones').
	localEvents *eventplane.Local
}

func (ff *frontendFlags) register(f *pflag.FlagSet, defaultModels []string) {
	f.StringVar(&ff.listen, "listen", ":8000", "HTTP address of the OpenAI API")
	f.StringSliceVar(&ff.models, "model", defaultModels, "model name(s) served (built-in o200k tokenizer and ChatML template)")
	f.StringVar(&ff.routerMode, "router-mode", string(router.ModeKV), router.ModeList())
	f.StringVar(&ff.routerCost, "router-cost", string(router.DefaultCost().Kind), "router cost model: time (predicted TTFT from the workers' timing model) or blocks (the blocks the worker must prefill, its queue plus this prompt less what it caches, plus the blocks it is decoding)")
	f.StringVar(&ff.tierLoadMS, "router-tier-load-ms", "", "time cost: ms to load one KV block onto a worker's device from each tier, as host=MS,disk=MS,object=MS (workers running a KV connector such as kvbm); a tier hit is then priced by its load time, the worker's onboarding backlog and the wait for device KV instead of the fixed credits 0.75/0.25/0.1 (empty: fixed credits; serve --connector kvbm: its simulated workers' own). The sim's defaults at 8 MiB blocks: host=0.168,disk=1.2,object=2.8")
	f.Float64Var(&ff.temperature, "router-temperature", 0, "softmax temperature of worker selection (0: always the cheapest)")
	f.IntVar(&ff.migrationLimit, "migration-limit", 3, "times a request may move to another worker when its worker dies")
	f.Int64Var(&ff.maxBodyBytes, "max-body-bytes", 16<<20, "largest request body accepted (413 above)")
	f.IntVar(&ff.maxTokensLimit, "max-tokens-limit", 0, "most tokens one request may ask to generate, 400 above (0: the context length: the smallest a worker of the model reports, a real engine's max_model_len or a worker's KV capacity); a request without max_tokens gets 256")
	f.BoolVar(&ff.replicaSync, "router-replica-sync", false, "share load bookings with other frontend replicas over NATS")
	f.Float64Var(&ff.busyKVUsage, "busy-kv-usage", 0, "a worker is busy above this fraction of its KV blocks in use; 503 when all are (0: off)")
	f.BoolVar(&ff.hints, "hints", true, "plan KV hints: send a request's worker to a peer that holds a longer prefix (only workers that advertise control endpoints take part)")
	f.StringVar(&ff.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&ff.tokenizer, "tokenizer", "", "a Hugging Face tokenizer: tokenizer.json, or its directory (chat template from tokenizer_config.json beside it), so the frontend tokenizes as the engine does (default: built-in o200k and ChatML)")
	f.IntVar(&ff.localPrefillTokens, "disagg-local-prefill-tokens", router.DefaultLocalPrefillTokens, "P/D: a request prefills on its decode worker when its net new prompt (prompt − what that worker holds) is under this many tokens and under --disagg-local-prefill-ratio of the prompt (0: never for length)")
	f.Float64Var(&ff.localPrefillRatio, "disagg-local-prefill-ratio", router.DefaultLocalPrefillRatio, "P/D: the second bound of local prefill, net new / prompt, in (0, 1]")
	def := frontend.DefaultTimeouts()
	f.DurationVar(&ff.timeouts.ReadHeader, "read-header-timeout", def.ReadHeader, "longest a client may take to send a request's headers (0: no limit)")
	f.DurationVar(&ff.timeouts.ReadBody, "read-body-timeout", def.ReadBody, "longest a client may take to send a request's body once its headers are in: a slower body is cut with its connection (0: no limit); responses and streams are not bounded")
	f.DurationVar(&ff.timeouts.Idle, "idle-timeout", def.Idle, "longest a keep-alive connection may wait for its next request (0: no limit)")
	addQueueFlags(f, &ff.queue, "off")
	ff.auth.register(f)
	ff.fleet.register(f)
	ff.tls.register(f)
}

// disagg is the cluster's conditional-disaggregation config.
func (ff *frontendFlags) disagg() router.DisaggConfig {
	c := router.DisaggConfig{LocalPrefillTokens: ff.localPrefillTokens, LocalPrefillRatio: ff.localPrefillRatio}
	if c.LocalPrefillTokens == 0 {
		c.LocalPrefillTokens = -1 // the flag's 0 is "never", the config's is "default"
	}
	return c
}

// runningFrontend is an HTTP frontend bound and serving.
type runningFrontend struct {
	cluster *fleet.Cluster
	srv     *http.Server
	ln      net.Listener
	errc    chan error
	// cancelRequests ends every request's context (BaseContext); the
	// frontend answers requests cut with frontend.ErrShuttingDown with 503.
	cancelRequests context.CancelCauseFunc
}

func startFrontend(ctx context.Context, ff *frontendFlags, nc *nats.Conn, disc *discovery.Discovery, log *slog.Logger) (*runningFrontend, error) {
	return startFrontendOn(ctx, ff, nc, disc, log, newMetricsRegistry())
}

// newMetricsRegistry is the registry behind a frontend's /metrics.
func newMetricsRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// startFrontendOn is startFrontend with /metrics served from reg (serve
// puts its workers' peer-transfer series there too).
func startFrontendOn(ctx context.Context, ff *frontendFlags, nc *nats.Conn, disc *discovery.Discovery, log *slog.Logger, reg *prometheus.Registry) (*runningFrontend, error) {
	mode, err := router.ParseMode(ff.routerMode)
	if err != nil {
		return nil, fmt.Errorf("--router-mode: %w", err)
	}
	var models frontend.StaticModels
	for _, name := range ff.models {
		m, err := loadModel(name, ff.tokenizer)
		if err != nil {
			return nil, err
		}
		models.Add(m)
	}
	if ff.busyKVUsage < 0 || ff.busyKVUsage > 1 {
		return nil, fmt.Errorf("--busy-kv-usage %g: want a fraction in [0, 1]", ff.busyKVUsage)
	}
	var kind router.CostKind // empty: the router's default
	if ff.routerCost != "" {
		if kind, err = router.ParseCostKind(ff.routerCost); err != nil {
			return nil, fmt.Errorf("--router-cost: %w", err)
		}
	}
	cost, err := router.CostByKind(kind)
	if err != nil {
		return nil, fmt.Errorf("--router-cost: %w", err)
	}
	cost.Temperature = ff.temperature
	tierLoad, err := router.ParseTierLoad(ff.tierLoadMS)
	if err != nil {
		return nil, fmt.Errorf("--router-tier-load-ms: %w", err)
	}
	if ff.tierLoadMS == "" {
		tierLoad = ff.simTierLoad
	}
	token, err := ff.fleet.token()
	if err != nil {
		return nil, err
	}
	queue, admit, err := ff.queue.config()
	if err != nil {
		return nil, err
	}
	_, clientTLS, err := ff.tls.configs()
	if err != nil {
		return nil, err
	}
	cl, err := fleet.New(ctx, fleet.Config{
		NC: nc, Discovery: disc, Models: ff.models, ReplicaSync: ff.replicaSync, Registerer: reg, Logger: log, Disagg: ff.disagg(),
		FleetToken: token, TLS: clientTLS, TierLoad: tierLoad, Queue: queue, Local: ff.local, LocalEvents: ff.localEvents,
		Router: router.Config{Mode: mode, Cost: &cost, MaxKVUsage: ff.busyKVUsage, Hints: ff.hints, Admit: admit},
	})
	if err != nil {
		return nil, err
	}
	cfg := frontend.DefaultConfig()
	cfg.MigrationLimit, cfg.MaxBodyBytes, cfg.Ready = ff.migrationLimit, ff.maxBodyBytes, cl.Ready
	cfg.Warnings = cl.Warnings
	cfg.MaxTokensLimit = ff.maxTokensLimit
	if cfg.APIKeys, err = ff.auth.apiKeys(); err != nil {
		cl.Close()
		return nil, err
	}
	if cfg.AdminKeys, err = ff.auth.adminKeys(); err != nil {
		cl.Close()
		return nil, err
	}
	cfg.OpenMetrics = ff.auth.openMetrics
	cfg.Tracer = ff.tracer
	cfg.Timeouts = ff.timeouts
	cfg.Logger = log
	srv := frontend.New(cfg, cl, &models, reg, reg).HTTPServer()
	ln := ff.ln
	if ln == nil {
		if ln, err = listenHTTP(ff.listen); err != nil {
			cl.Close()
			return nil, err
		}
	}
	reqCtx, cancelRequests := context.WithCancelCause(context.Background())
	srv.BaseContext = func(net.Listener) context.Context { return reqCtx }
	rf := &runningFrontend{cluster: cl, srv: srv, ln: ln, errc: make(chan error, 1), cancelRequests: cancelRequests}
	go func() { rf.errc <- srv.Serve(ln) }()
	return rf, nil
}

// url is where clients reach the API: a wildcard bind is shown as loopback.
func (rf *runningFrontend) url() string {
	addr := rf.ln.Addr().(*net.TCPAddr)
	host := addr.IP.String()
	if addr.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	return fmt.Sprintf("http://%s/v1", net.JoinHostPort(host, fmt.Sprint(addr.Port)))
}

// shutdown stops accepting requests, gives streams in flight a moment to
// finish, then cancels the rest so Ctrl-C never hangs on a long generation.
func (rf *runningFrontend) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := rf.srv.Shutdown(ctx); err != nil {
		rf.cancelRequests(frontend.ErrShuttingDown)
		// A moment for the cut requests to write their 503 or error event.
		ctx, cancel := context.WithTimeout(context.Background(), shutdownAnswer)
		if rf.srv.Shutdown(ctx) != nil {
			_ = rf.srv.Close()
		}
		cancel()
	}
	rf.cancelRequests(frontend.ErrShuttingDown)
	rf.cluster.Close()
}

// shutdownGrace is how long in-flight streams may run on after Ctrl-C;
// shutdownAnswer how long those then cut have to say so.
const (
	shutdownGrace  = 1 * time.Second
	shutdownAnswer = 250 * time.Millisecond
)

func newServeCmd() *cobra.Command {
	ff := &frontendFlags{}
	sf := sim.DefaultConfig()
	var workers int
	var pd pdFlags
	var stallTimeout time.Duration
	var nf natsFlags
	var dataDir, natsListen string
	var insecureNATS bool
	var kf kvbmFlags
	var loras []string
	ef := &serveEngineFlags{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run a whole kvmesh cluster in one process: embedded NATS, OpenAI frontend, router and simulated workers",
		Long: `serve starts an embedded NATS server (or joins --nats), N simulated workers and the
OpenAI-compatible frontend with the KV-aware router, all in one process. Ctrl-C or
SIGTERM stops accepting requests, gives those in flight 1 s, then cuts them and exits 0.
A live dashboard of the fleet is at http://<host:port>/dashboard, Prometheus series at
/metrics (docs/metrics.md). Every flag has a KVMESH_* environment variable.
OpenTelemetry traces follow the standard OTEL_* variables
(OTEL_EXPORTER_OTLP_ENDPOINT turns them on; off when unset).

On startup it prints one line to stdout:
  kvmesh serve: model <name> on <n> simulated workers (router <mode>); OpenAI API at http://<host:port>/v1 (NATS <url>)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (pd.prefill > 0 || pd.decode > 0) && !cmd.Flags().Changed("workers") {
				workers = 0 // a P/D fleet unless aggregated workers are asked for too
			}
			sf.KVBM = nil
			if ef.engine != "sim" && kf.connector != "" {
				return fmt.Errorf("--connector %s with --engine %s: a real engine loads its connector itself (kvmesh worker --connector … --connector-config-out prints its configuration where kvmesh has one)", kf.connector, ef.engine)
			}
			if err := refuseIgnoredFlags(cmd.Flags(), flagUse{command: "serve", engine: ef.engine, role: kv.RoleAggregated, connector: kf.connector,
				prefillWorkers: pd.prefill, decodeWorkers: pd.decode}); err != nil {
				return err
			}
			if err := kf.check(kv.RoleAggregated); err != nil {
				return err
			}
			sf.KVBM = kf.sim()
			ff.simTierLoad = sim.KVBMTierLoadMS(sf)
			return runServe(cmd, ff, sf, workers, pd, stallTimeout, nf, dataDir, natsListen, insecureNATS, ef, loras)
		},
	}
	f := cmd.Flags()
	ff.register(f, []string{"kvmesh-sim"})
	f.IntVar(&workers, "workers", 4, "simulated aggregated workers to start (0 when only --prefill-workers/--decode-workers are given)")
	f.IntVar(&pd.prefill, "prefill-workers", 0, "simulated prefill workers (disaggregated serving; needs --decode-workers too)")
	f.IntVar(&pd.decode, "decode-workers", 0, "simulated decode workers (disaggregated serving; needs --prefill-workers too)")
	f.DurationVar(&sf.Disagg.TTL, "disagg-handoff-ttl", sim.DefaultHandoffTTL, "sim: how long a prefill answer's blocks stay pinned when no decode worker reads them")
	registerStallTimeout(f, &stallTimeout)
	nf.registerURL(f, "", "external NATS URL(s), comma-separated; empty starts an embedded server")
	f.StringVar(&dataDir, "data-dir", "", "embedded NATS JetStream directory (default: a temporary one)")
	f.StringVar(&natsListen, "nats-listen", "127.0.0.1:0", "embedded NATS client address (port 0: a free one; 127.0.0.1:4222 lets worker and frontend join with their default --nats, given the same --fleet-token-file)")
	f.BoolVar(&insecureNATS, "insecure-nats", false, "run the embedded NATS server without authentication (by default each client proves an identity derived from the fleet token; docs/security.md)")
	f.IntVar(&sf.BlockSize, "block-size", sf.BlockSize, "tokens per KV block (real engine: when set, every engine's must agree)")
	f.IntVar(&sf.Blocks, "blocks", sf.Blocks, "sim: device KV capacity in blocks per worker")
	f.IntVar(&sf.MaxBatchedTokens, "max-batched-tokens", sf.MaxBatchedTokens, "sim: token budget per scheduler step")
	f.IntVar(&sf.MaxSeqs, "max-seqs", sf.MaxSeqs, "sim: running sequences per step")
	f.IntVar(&sf.DPSize, "dp-size", 1, "data-parallel ranks per worker (sim: each its own engine, cache, load and KV events; real engine: the ranks behind every server, rank r's KV events on --kv-events' port + r); routed per rank")
	f.Float64Var(&sf.SpeedupRatio, "speedup-ratio", sf.SpeedupRatio, "sim: divide modelled time by this (0: no waiting)")
	f.StringSliceVar(&loras, "lora", nil, "sim: LoRA adapters every simulated worker serves, requested by name in the model field (each its own KV hash domain)")
	f.BoolVar(&ff.workerGRPC, "worker-grpc", false, "reach serve's own workers over gRPC with protobuf and take their KV events over NATS, as remote ones', instead of in process (to compare the two paths)")
	addKVBMFlags(f, &kf)
	ef.register(f)
	cmd.RunE = quietOnInterrupt(cmd.RunE)
	return withEnv(cmd, "")
}

// pdFlags are serve's disaggregated pools.
type pdFlags struct{ prefill, decode int }

func runServe(cmd *cobra.Command, ff *frontendFlags, sf sim.Config, workers int, pd pdFlags, stallTimeout time.Duration, nf natsFlags, dataDir, natsListen string, insecureNATS bool, ef *serveEngineFlags, loras []string) error {
	log, err := workerLogger(ff.logLevel, os.Stderr)
	if err != nil {
		return err
	}
	if err := checkInts(intFlag{"prefill-workers", int64(pd.prefill), 0}, intFlag{"decode-workers", int64(pd.decode), 0}); err != nil {
		return err
	}
	if (pd.prefill > 0) != (pd.decode > 0) {
		return fmt.Errorf("--prefill-workers %d --decode-workers %d: disaggregated serving needs both", pd.prefill, pd.decode)
	}
	if pd.prefill == 0 && workers < 1 {
		return fmt.Errorf("--workers %d: want at least 1", workers)
	}
	if workers < 0 {
		return fmt.Errorf("--workers %d: want at least 0", workers)
	}
	if sf.Disagg.TTL <= 0 {
		return fmt.Errorf("--disagg-handoff-ttl %v: want > 0", sf.Disagg.TTL)
	}
	if err := ff.validate(); err != nil {
		return err
	}
	if err := checkSimFlags(sf); err != nil {
		return err
	}
	if err := checkLoRAFlag(loras, ff.models[0]); err != nil {
		return err
	}
	if err := checkInts(intFlag{"dp-size", int64(sf.DPSize), 1}); err != nil {
		return err
	}
	if err := checkStallTimeout(stallTimeout); err != nil {
		return err
	}
	if nf.url != "" && dataDir != "" {
		return fmt.Errorf("--data-dir is the embedded NATS server's store; with --nats there is none")
	}
	if len(ff.models) != 1 {
		return fmt.Errorf("--model: serve runs one model, got %d", len(ff.models))
	}
	list, err := ef.engines()
	if err != nil {
		return err
	}
	if err := ef.refuseLocalPrefill(cmd, list, ff); err != nil {
		return err
	}
	modeNote, err := serveRouterMode(cmd, ff, list)
	if err != nil {
		return err
	}
	natsHost, natsPort, err := parseNATSListen(natsListen)
	if err != nil {
		return err
	}
	if nf.url != "" && cmd.Flags().Changed("nats-listen") {
		return fmt.Errorf("--nats-listen is the embedded NATS server's address; with --nats there is none")
	}
	// A busy port is reported before NATS and the workers start.
	if ff.ln, err = listenHTTP(ff.listen); err != nil {
		return err
	}
	defer func() {
		if ff.ln != nil {
			ff.ln.Close() // closed by the server once it serves; this covers an early return
		}
	}()
	warnOpenListen(log, ff)
	// Without a configured token serve draws one: its workers' API and
	// transfer ports and its NATS server then answer only this process.
	fleetToken, err := ff.fleet.tokenOrRandom()
	if err != nil {
		return err
	}
	serverTLS, clientTLS, err := ff.tls.configs()
	if err != nil {
		return err
	}
	tracer, stopTracing, err := setupTracing(cmd.Context(), "kvmesh", log)
	if err != nil {
		return err
	}
	defer stopTracing()
	ff.tracer = tracer
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// Others can listen to serve's NATS when it is not serve's own, when
	// it authenticates no one, or when they hold the fleet token.
	othersListen := nf.url != "" || insecureNATS || ff.fleet.generated == ""
	if nf.url == "" {
		nc := natsbus.EmbeddedConfig{Host: natsHost, Port: natsPort, DataDir: dataDir, Logger: log}
		if !insecureNATS {
			nc.FleetKey = fleetkey.Derive(fleetToken, fleetkey.NATS)
		}
		warnInsecureNATS(log, insecureNATS, natsListen)
		ns, err := natsbus.StartEmbedded(nc)
		if err != nil {
			return err
		}
		defer ns.Shutdown()
		nf.url, nf.cred = ns.URL(), ns.Admin()
	} else if insecureNATS {
		return fmt.Errorf("--insecure-nats turns off the embedded NATS server's authentication; with --nats there is none")
	}
	nf.discoveryKey = fleetkey.Derive(fleetToken, fleetkey.Discovery)
	if !ff.workerGRPC {
		ff.localEvents = eventplane.NewLocal(othersListen)
	}
	nc, disc, err := nf.controlPlane(ctx, "kvmesh-serve", log)
	if err != nil {
		return err
	}
	defer nc.Close()

	// With hints on, every worker serves its cache on a loopback control
	// endpoint and fetches hinted prefixes from its peers; the transfer
	// series land on the frontend's /metrics.
	reg := newMetricsRegistry()
	var pm *worker.PeerMetrics
	if ff.hints {
		if pm, err = worker.NewPeerMetrics(reg); err != nil {
			return err
		}
	}
	var ws []*worker.Worker
	defer func() {
		for _, w := range ws {
			_ = w.Close()
		}
	}()
	var engineDesc string
	if ef.engine != "sim" {
		// Real engines: one worker each, no simulated ones.
		if ws, err = startEngineWorkers(ctx, cmd, ef, ff, nc, sf.DPSize, sf.BlockSize, stallTimeout, reg, log); err != nil {
			return err
		}
		workers, pd, engineDesc = 0, pdFlags{}, fmt.Sprintf("%d %s engines", len(ws), ef.engine)
	}
	roles := make([]kv.Role, 0, workers+pd.prefill+pd.decode)
	for range workers {
		roles = append(roles, kv.RoleAggregated)
	}
	for range pd.prefill {
		roles = append(roles, kv.RolePrefill)
	}
	for range pd.decode {
		roles = append(roles, kv.RoleDecode)
	}
	if pd.prefill > 0 && pm == nil {
		// Decode workers pull their prompts' KV from prefill workers over
		// the same transfer protocol, hints or not.
		if pm, err = worker.NewPeerMetrics(reg); err != nil {
			return err
		}
	}
	for i, role := range roles {
		cfg := sf
		cfg.Model, cfg.Role = ff.models[0], role
		cfg.OutputTokens = simOutputTokens()
		var instance uint64
		if cfg.KVBM != nil {
			// The disk tier's file is named by the instance.
			instance = randomInstanceID()
			cfg.Worker.Instance = instance
		}
		var eng *sim.Engine
		var peer *worker.Peer
		if ff.hints || role != kv.RoleAggregated {
			eng, peer, err = newSimPeer(cfg, worker.PeerConfig{Listen: "127.0.0.1:0", AdvertiseHost: "127.0.0.1",
				Metrics: pm, Logger: log.With("worker", i), Token: fleetToken, ServerTLS: serverTLS, ClientTLS: clientTLS})
		} else {
			eng, err = sim.New(cfg)
		}
		if err != nil {
			return fmt.Errorf("sim engine: %w", err)
		}
		wc := worker.Config{Model: cfg.Model, Role: cfg.Role, LoRAs: loras, Logger: log.With("worker", i), Peer: peer, Registerer: reg,
			FleetToken: fleetToken, TLS: serverTLS, Tracer: tracer, Engine: "sim",
			StallTimeout: stallTimeoutConfig(stallTimeout), Discovery: discovery.Config{Logger: log}, LocalEvents: ff.localEvents}
		if cfg.KVBM != nil {
			wc.InstanceID = instance
			if err := registerKVBMMetrics(reg, eng.KVBMStats, cfg.Model, instance); err != nil {
				eng.Close()
				return err
			}
		}
		w, err := worker.New(wc, eng, nc)
		if err != nil {
			eng.Close()
			return err
		}
		if err := w.Start(ctx); err != nil {
			_ = w.Close()
			return fmt.Errorf("worker %d: %w", i, err)
		}
		ws = append(ws, w)
	}

	if !ff.workerGRPC {
		for _, w := range ws {
			ff.local = append(ff.local, w.Local())
		}
	}
	rf, err := startFrontendOn(ctx, ff, nc, disc, log, reg)
	if err != nil {
		return err
	}
	ff.ln = nil // the server owns it now
	defer rf.shutdown()
	if err := waitReady(ctx, rf.cluster, 10*time.Second); err != nil {
		return err
	}
	fleet := fmt.Sprintf("%d simulated workers", workers)
	if pd.prefill > 0 {
		fleet = fmt.Sprintf("%d prefill + %d decode simulated workers", pd.prefill, pd.decode)
		if workers > 0 {
			fleet += fmt.Sprintf(" + %d aggregated", workers)
		}
	}
	if sf.DPSize > 1 {
		fleet += fmt.Sprintf(" of %d DP ranks", sf.DPSize)
	}
	if engineDesc != "" {
		fleet = engineDesc
	}
	fmt.Fprintf(cmd.OutOrStdout(), "kvmesh serve: model %s on %s (router %s%s); OpenAI API at %s (NATS %s)\n",
		ff.models[0], fleet, ff.routerMode, modeNote, rf.url(), nf.url)
	select {
	case <-ctx.Done():
		log.Info("shutting down")
		return nil
	case err := <-rf.errc:
		return fmt.Errorf("http server: %w", err)
	}
}

// waitReady waits until every served model has a routable worker.
func waitReady(ctx context.Context, cl *fleet.Cluster, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		err := cl.Ready()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %w", limit, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func init() {
	rootCmd.AddCommand(newServeCmd())
}
