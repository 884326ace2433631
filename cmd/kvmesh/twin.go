package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/twin"
)

// twinFlags is `kvmesh twin`'s command line.
type twinFlags struct {
	trace          string
	mode           string
	compare        string
	out            string
	strict         bool
	maxRequests    int
	traceBlockSize int
	cfg            twin.Config
	costKind       string
	prefillScale   float64
	workWeight     float64
	temperature    float64
	kvbm           kvbmFlags
	fleets         string
	ladder         string
	ladderSLOMS    float64
	queue          queueFlags
}

func init() { rootCmd.AddCommand(newTwinCmd()) }

func newTwinCmd() *cobra.Command {
	var tf twinFlags
	cmd := &cobra.Command{
		Use:   "twin",
		Short: "Replay a trace on a simulated fleet in virtual time and measure routing modes",
		Long: `Replays a Mooncake-style JSONL trace against N simulated engines in virtual
time, routing every request with the real router, and reports TTFT, ITL and
end-to-end latency, throughput and the prefix hit ratio split into device /
fetched from peers / host / disk (host and disk stay 0 until KVBM tiers
exist). Modes: round-robin, random, kv (index fed by the engines' KV
events), kv-approx (router's own routing history) and kv+hints (kv with KV
hints: the chosen engine copies the hinted blocks from a peer, paying the
modelled transfer time).

--prefill-workers P --decode-workers M runs disaggregated prefill/decode
instead of --workers aggregated ones, with the fleet's policy (package
router): conditional disaggregation (--disagg-local-prefill-tokens/-ratio),
a prefill leg routed by the mode over the prefill pool (carrying the hint in
kv+hints), a decode leg routed by load over the decode pool that pulls the
prompt's blocks from the prefill worker (modelled at --bandwidth, beside the
decode passes); it reports requests per path (disagg, local_prefill by
reason) and the handoffs. An explicit --workers beside them makes a mixed
fleet (a request goes whole to the aggregated pool while it is the less
loaded). --fleets "8,4+4,2+6" runs several fleets (N aggregated, P+D, or
A+P+D mixed) side by side, each in every mode.

Open loop by default (trace timestamps divided by --arrival-speedup);
--concurrency C runs a closed loop of C clients instead. --compare runs
several modes side by side; --out writes twin.json and two SVG charts.
Results are deterministic for a given --seed. Each mode's output ends with
  twin: mode=<m> requests=<n> hit=<ratio> reachable=<ratio> ttft_p50_ms=<x> ttft_mean_ms=<y> wall_s=<z>
--ladder 1,2,4,6,8,12 replays the trace at each arrival speedup in every
mode and prints one row per speedup and mode (hit, reachable, TTFT
p50/p90/p99/mean, req/s, preemptions), then per mode
  twin: capacity mode=<m> p90_ttft_le_ms=<slo> max_speedup=<x>
the highest speedup whose p90 TTFT stays under --ladder-slo-ms (0: none).
--router-queue on puts the router's queue in front of the fleet:
a worker is sent a request only while it can admit it (--admit-kv-usage,
--admit-prefill-passes, --admit-waiting, each relative to the worker's own
capacity); the rest wait in the router (--router-queue-policy fcfs, wspt or
priority; --router-queue-limit; --router-queue-max-wait, the age bound) and
are routed when a worker frees capacity, kv modes waiting for the worker
that holds their prefix. With P/D it holds legs: a request whose prefill
(or local prefill) no worker admits waits for one, and a decode leg whose
decode pool is full waits after its prefill, its blocks pinned. The wait is part of TTFT and is reported on its own
(queue_wait_mean_ms= in the last line). Off by default, which reproduces
the runs without it byte for byte.
Malformed trace lines are reported with their line numbers and skipped
(--strict fails on the first). It exits 1 when a mode completes no request
(every one rejected, e.g. longer than --blocks holds). Every flag has a KVMESH_TWIN_* environment
variable (--trace also reads KVMESH_TRACE).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if tf.trace == "" {
				tf.trace = traceFromEnv()
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			return runTwin(ctx, tf, cmd.Flags(), cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&tf.trace, "trace", "", "Mooncake JSONL trace (required; or KVMESH_TRACE)")
	f.StringVar(&tf.mode, "router", string(router.ModeKV), "routing mode: "+strings.Join(twin.Modes, ", "))
	f.StringVar(&tf.compare, "compare", "", "comma-separated modes to run side by side (overrides --router)")
	f.StringVar(&tf.out, "out", "", "directory for twin.json, twin_ttft_cdf.svg and twin_hit_ratio.svg")
	f.BoolVar(&tf.strict, "strict", false, "fail on the first malformed trace line instead of skipping it")
	f.IntVar(&tf.maxRequests, "requests", 0, "replay only the first N trace lines (0: all)")
	f.IntVar(&tf.traceBlockSize, "trace-block-size", 512, "tokens per trace hash id")
	f.IntVar(&tf.cfg.Workers, "workers", twin.DefaultWorkers, "simulated workers")
	f.IntVar(&tf.cfg.BlockSize, "block-size", 64, "engine KV block size in tokens")
	f.IntVar(&tf.cfg.Blocks, "blocks", 16384, "KV blocks per worker")
	f.IntVar(&tf.cfg.MaxBatchedTokens, "max-batched-tokens", 8192, "engine token budget per pass")
	f.IntVar(&tf.cfg.MaxSeqs, "max-seqs", 256, "engine running-sequence limit")
	f.Float64Var(&tf.cfg.ArrivalSpeedup, "arrival-speedup", 1, "open loop: divide trace inter-arrival times by this")
	f.IntVar(&tf.cfg.Concurrency, "concurrency", 0, "closed loop with this many requests outstanding (0: open loop)")
	f.Uint64Var(&tf.cfg.Seed, "seed", 1, "seed of the router's random choices and the requests' sampling")
	f.Float64Var(&tf.cfg.TransferBandwidth, "bandwidth", 64e9, "peer KV transfer bandwidth, bytes/s (negative: transfers are free)")
	f.Int64Var(&tf.cfg.KVBytesPerToken, "kv-bytes-per-token", twin.DefaultKVBytesPerToken, "modelled KV bytes per token (Llama-3-8B fp16: 131072)")
	f.DurationVar(&tf.cfg.LoadInterval, "load-interval", twin.DefaultLoadInterval, "virtual time between a busy worker's load reports")
	f.Float64Var(&tf.cfg.MaxKVUsage, "busy-kv-usage", 0, "router busy threshold: KV usage fraction (0: off); busy requests are rejected")
	f.Int64Var(&tf.cfg.MaxPrefillTokens, "busy-prefill-tokens", 0, "router busy threshold: active prefill tokens (0: off)")
	f.DurationVar(&tf.cfg.ApproxTTL, "approx-ttl", 120*time.Second, "kv-approx: how long a routed prefix is assumed cached")
	f.StringVar(&tf.costKind, "router-cost", "", "router cost model: blocks (the blocks the worker must prefill, its queue plus this prompt less what it caches, plus the blocks it is decoding) or time (predicted TTFT ms); empty: the router's default")
	f.Float64Var(&tf.prefillScale, "prefill-scale", 1, "router cost: weight of prefill blocks against decode blocks (Dynamo's overlap weight)")
	f.Float64Var(&tf.workWeight, "work-weight", router.TimeCost().WorkWeight, "router time cost: weight of the request's own prefill time on top of its predicted TTFT")
	f.Float64Var(&tf.temperature, "temperature", 0, "router cost: softmax temperature (0: arg-min)")
	addKVBMFlags(f, &tf.kvbm)
	f.IntVar(&tf.cfg.PrefillWorkers, "prefill-workers", 0, "disaggregated prefill workers (with --decode-workers; replaces the --workers default, or joins an explicit --workers in a mixed fleet)")
	f.IntVar(&tf.cfg.DecodeWorkers, "decode-workers", 0, "disaggregated decode workers (with --prefill-workers)")
	f.IntVar(&tf.cfg.LocalPrefillTokens, "disagg-local-prefill-tokens", router.DefaultLocalPrefillTokens, "P/D: prefill on the decode worker when the net new prompt is under this many tokens (and under the ratio); negative: never for length")
	f.Float64Var(&tf.cfg.LocalPrefillRatio, "disagg-local-prefill-ratio", router.DefaultLocalPrefillRatio, "P/D: … and under this fraction of the prompt, in (0, 1]")
	f.StringVar(&tf.fleets, "fleets", "", `comma-separated fleets to compare, each N (aggregated), P+D (prefill+decode) or A+P+D (mixed), e.g. "8,4+4,2+6"; overrides --workers and --prefill/decode-workers`)
	f.StringVar(&tf.ladder, "ladder", "", `comma-separated arrival speedups, e.g. "1,2,4,6,8,12": replay the trace at each, in every mode, print a row per speedup and mode and each mode's capacity (replaces --arrival-speedup; --out writes ladder_ttft.svg and ladder_hit.svg)`)
	f.Float64Var(&tf.ladderSLOMS, "ladder-slo-ms", twin.DefaultLadderSLOMS, "ladder: the p90 TTFT (ms) a speedup must stay under to count as within capacity")
	addQueueFlags(f, &tf.queue, "off")
	return withEnv(cmd, "TWIN_")
}

// twinModes is the list of modes to run: --compare, else --router.
func twinModes(tf twinFlags) ([]string, error) {
	list := tf.mode
	if strings.TrimSpace(tf.compare) != "" {
		list = tf.compare
	}
	var modes []string
	for _, s := range strings.Split(list, ",") {
		m, _, _, err := twin.ParseMode(s)
		if err != nil {
			return nil, err
		}
		for _, x := range modes {
			if x == m {
				return nil, fmt.Errorf("mode %q listed twice", m)
			}
		}
		modes = append(modes, m)
	}
	return modes, nil
}

const maxSkippedShown = 20

func runTwin(ctx context.Context, tf twinFlags, fs *pflag.FlagSet, out, errOut io.Writer) error {
	if tf.trace == "" {
		return fmt.Errorf("twin: --trace is required")
	}
	modes, err := twinModes(tf)
	if err != nil {
		return fmt.Errorf("twin: %w", err)
	}
	pd := tf.cfg.PrefillWorkers != 0 || tf.cfg.DecodeWorkers != 0
	if pd && !fs.Changed("workers") {
		tf.cfg.Workers = 0 // P/D replaces the aggregated default
	}
	// Parsed here to fail early, again below once tf.cfg is complete.
	fleets, err := twinFleets(tf)
	if err != nil {
		return fmt.Errorf("twin: --fleets: %w", err)
	}
	// Zero means "default" inside the twin package; on the command line it
	// is a mistake.
	for _, v := range []struct {
		name string
		v    int
	}{{"trace-block-size", tf.traceBlockSize}, {"block-size", tf.cfg.BlockSize},
		{"blocks", tf.cfg.Blocks}, {"max-batched-tokens", tf.cfg.MaxBatchedTokens}, {"max-seqs", tf.cfg.MaxSeqs}} {
		if v.v <= 0 {
			return fmt.Errorf("twin: --%s %d, want ≥ 1", v.name, v.v)
		}
	}
	for _, fl := range fleets {
		switch {
		case fl.PrefillWorkers == 0 && fl.DecodeWorkers == 0 && fl.Workers <= 0:
			return fmt.Errorf("twin: --workers %d, want ≥ 1", fl.Workers)
		case fl.PrefillWorkers < 0 || fl.DecodeWorkers < 0 || (fl.PrefillWorkers+fl.DecodeWorkers > 0 && (fl.PrefillWorkers == 0 || fl.DecodeWorkers == 0)):
			return fmt.Errorf("twin: --prefill-workers %d and --decode-workers %d, want both ≥ 1", fl.PrefillWorkers, fl.DecodeWorkers)
		}
	}
	if !(tf.cfg.LocalPrefillRatio > 0 && tf.cfg.LocalPrefillRatio <= 1) {
		return fmt.Errorf("twin: --disagg-local-prefill-ratio %g, want in (0, 1]", tf.cfg.LocalPrefillRatio)
	}
	if tf.cfg.LocalPrefillTokens == 0 {
		return fmt.Errorf("twin: --disagg-local-prefill-tokens 0, want > 0 (or negative: never for length)")
	}
	if !(tf.cfg.ArrivalSpeedup > 0) || math.IsInf(tf.cfg.ArrivalSpeedup, 0) {
		return fmt.Errorf("twin: --arrival-speedup %g, want a finite number > 0", tf.cfg.ArrivalSpeedup)
	}
	for _, v := range []struct {
		name string
		v    time.Duration
	}{{"load-interval", tf.cfg.LoadInterval}, {"approx-ttl", tf.cfg.ApproxTTL}} {
		if v.v <= 0 {
			return fmt.Errorf("twin: --%s %v, want > 0", v.name, v.v)
		}
	}
	var speedups []float64
	if strings.TrimSpace(tf.ladder) != "" {
		if speedups, err = twinLadderFlags(tf, fs, fleets); err != nil {
			return fmt.Errorf("twin: %w", err)
		}
	}
	if tf.cfg.KVBytesPerToken <= 0 {
		return fmt.Errorf("twin: --kv-bytes-per-token %d, want ≥ 1", tf.cfg.KVBytesPerToken)
	}
	for _, v := range []struct {
		name string
		v    int64
	}{{"requests", int64(tf.maxRequests)}, {"concurrency", int64(tf.cfg.Concurrency)},
		{"busy-prefill-tokens", tf.cfg.MaxPrefillTokens}} {
		if v.v < 0 {
			return fmt.Errorf("twin: --%s %d, want ≥ 0", v.name, v.v)
		}
	}
	for _, v := range []struct {
		name string
		v    float64
	}{{"temperature", tf.temperature}, {"prefill-scale", tf.prefillScale}, {"work-weight", tf.workWeight}} {
		if !(v.v >= 0) || math.IsInf(v.v, 0) {
			return fmt.Errorf("twin: --%s %g, want a finite number ≥ 0", v.name, v.v)
		}
	}
	if tf.cfg.MaxKVUsage < 0 || tf.cfg.MaxKVUsage > 1 || math.IsNaN(tf.cfg.MaxKVUsage) {
		return fmt.Errorf("twin: --busy-kv-usage %g, want a fraction in [0, 1]", tf.cfg.MaxKVUsage)
	}
	if err := tf.kvbm.check(kv.RoleAggregated); err != nil {
		return fmt.Errorf("twin: %w", err)
	}
	tf.cfg.KVBM = tf.kvbm.twin()
	if tf.out != "" {
		// Fail before the replay, not after it.
		if err := os.MkdirAll(tf.out, 0o755); err != nil {
			return fmt.Errorf("twin: --out: %w", err)
		}
	}
	if tf.costKind != "" || fs.Changed("prefill-scale") || fs.Changed("work-weight") || fs.Changed("temperature") {
		var kind router.CostKind
		if tf.costKind != "" {
			if kind, err = router.ParseCostKind(tf.costKind); err != nil {
				return fmt.Errorf("twin: --router-cost: %w", err)
			}
		}
		c, err := router.CostByKind(kind)
		if err != nil {
			return fmt.Errorf("twin: --router-cost: %w", err)
		}
		if fs.Changed("prefill-scale") {
			c.PrefillScale = tf.prefillScale
		}
		if fs.Changed("work-weight") {
			c.WorkWeight = tf.workWeight
		}
		if fs.Changed("temperature") {
			c.Temperature = tf.temperature
		}
		tf.cfg.Cost = &c
	}
	qc, ac, err := tf.queue.config()
	if err != nil {
		return fmt.Errorf("twin: %w", err)
	}
	if qc != nil {
		tf.cfg.Queue = &twin.Queue{QueueConfig: *qc, Admit: *ac}
	}
	if fleets, err = twinFleets(tf); err != nil {
		return fmt.Errorf("twin: --fleets: %w", err)
	}
	wl, err := twin.LoadWorkload(tf.trace, twin.LoadOptions{TraceBlockSize: tf.traceBlockSize, Strict: tf.strict, MaxRequests: tf.maxRequests})
	if err != nil {
		return err
	}
	for i, le := range wl.Skipped {
		if i == maxSkippedShown {
			fmt.Fprintf(errOut, "twin: … and %d more malformed lines skipped\n", len(wl.Skipped)-i)
			break
		}
		fmt.Fprintf(errOut, "twin: %s: line %d: %v (skipped)\n", tf.trace, le.Line, le.Err)
	}
	if len(wl.Requests) == 0 {
		return fmt.Errorf("twin: %s holds no valid requests (%d malformed lines skipped)", tf.trace, len(wl.Skipped))
	}
	if speedups != nil {
		return runTwinLadder(ctx, tf, wl, modes, speedups, out, errOut)
	}
	shape := fmt.Sprintf("%d workers", tf.cfg.Workers)
	switch {
	case len(fleets) > 1:
		shape = "fleets " + tf.fleets
	case pd:
		shape = fmt.Sprintf("%d prefill + %d decode workers", tf.cfg.PrefillWorkers, tf.cfg.DecodeWorkers)
	}
	fmt.Fprintf(out, "trace %s: %d requests (%d malformed lines skipped); %s × %d blocks × %d tokens\n",
		tf.trace, len(wl.Requests), len(wl.Skipped), shape, tf.cfg.Blocks, tf.cfg.BlockSize)
	var results []*twin.Result
	var cfg twin.Config
	for _, fl := range fleets {
		for _, m := range modes {
			c := fl
			c.Mode = m
			res, err := twin.Run(ctx, wl, c)
			if err != nil && ctx.Err() != nil {
				return fmt.Errorf("twin: interrupted during mode %s", m)
			}
			if err != nil {
				return fmt.Errorf("twin: mode %s: %w", m, err)
			}
			if err := res.WriteSummary(out); err != nil {
				return err
			}
			results = append(results, res)
			cfg = c
		}
	}
	if len(results) > 1 {
		fmt.Fprintln(out)
		if err := twin.WriteComparison(out, results); err != nil {
			return err
		}
	}
	if tf.out != "" {
		if cfg, err = cfg.Normalize(); err != nil {
			return err
		}
		cfg.Mode = strings.Join(modes, ",")
		paths, err := twin.WriteReport(tf.out, twin.Report{Trace: tf.trace, TraceLines: len(wl.Requests),
			SkippedLines: len(wl.Skipped), Config: cfg, Fleets: fleetsLabel(tf, fleets), Results: results})
		if err != nil {
			return err
		}
		for _, p := range paths {
			fmt.Fprintf(errOut, "twin: wrote %s\n", p)
		}
	}
	for _, res := range results {
		// Every request rejected (all too long for --blocks, or all busy):
		// the figures above are zeros, not a measurement.
		if res.Requests == 0 {
			return fmt.Errorf("twin: mode %s completed none of its %d requests (all rejected; see above)", res.Mode, res.Rejected)
		}
	}
	return nil
}

// twinFleets is the list of fleets to run: --fleets, else the one the
// worker flags give.
func twinFleets(tf twinFlags) ([]twin.Config, error) {
	if strings.TrimSpace(tf.fleets) == "" {
		return []twin.Config{tf.cfg}, nil
	}
	var out []twin.Config
	for _, f := range strings.Split(tf.fleets, ",") {
		f = strings.TrimSpace(f)
		c := tf.cfg
		c.Workers, c.PrefillWorkers, c.DecodeWorkers = 0, 0, 0
		parts := strings.Split(f, "+")
		ns := make([]int, len(parts))
		var err error
		for i, p := range parts {
			if ns[i], err = strconv.Atoi(strings.TrimSpace(p)); err == nil && ns[i] < 1 {
				err = errors.New("every count must be ≥ 1")
			}
			if err != nil {
				break
			}
		}
		switch {
		case err != nil:
		case len(ns) == 1:
			c.Workers = ns[0]
		case len(ns) == 2:
			c.PrefillWorkers, c.DecodeWorkers = ns[0], ns[1]
		case len(ns) == 3:
			c.Workers, c.PrefillWorkers, c.DecodeWorkers = ns[0], ns[1], ns[2]
		default:
			err = errors.New("too many counts")
		}
		if err != nil {
			return nil, fmt.Errorf("fleet %q: want N aggregated workers, P+D prefill+decode workers or A+P+D (a mixed fleet): %v", f, err)
		}
		out = append(out, c)
	}
	return out, nil
}

func fleetsLabel(tf twinFlags, fleets []twin.Config) string {
	if len(fleets) < 2 {
		return ""
	}
	return tf.fleets
}

// twinLadderFlags checks the flags --ladder runs with and parses it.
func twinLadderFlags(tf twinFlags, fs *pflag.FlagSet, fleets []twin.Config) ([]float64, error) {
	switch {
	case fs.Changed("arrival-speedup"):
		return nil, errors.New("--ladder replaces --arrival-speedup; give one of them")
	case tf.cfg.Concurrency != 0:
		return nil, errors.New("--ladder steps the open loop's arrival speedup; it cannot run with --concurrency")
	case len(fleets) > 1:
		return nil, errors.New("--ladder runs one fleet; drop --fleets")
	case !(tf.ladderSLOMS > 0) || math.IsInf(tf.ladderSLOMS, 0):
		return nil, fmt.Errorf("--ladder-slo-ms %g, want a finite number > 0", tf.ladderSLOMS)
	}
	sp, err := twin.ParseLadder(tf.ladder)
	if err != nil {
		return nil, fmt.Errorf("--ladder: %w", err)
	}
	return sp, nil
}

// runTwinLadder replays wl at every speedup in every mode and prints the
// ladder and each mode's capacity; --out gets its two charts.
func runTwinLadder(ctx context.Context, tf twinFlags, wl *twin.Workload, modes []string, speedups []float64, out, errOut io.Writer) error {
	fmt.Fprintf(out, "trace %s: %d requests (%d malformed lines skipped); ladder %s × modes %s\n",
		tf.trace, len(wl.Requests), len(wl.Skipped), tf.ladder, strings.Join(modes, ","))
	l, err := twin.RunLadder(ctx, wl, tf.cfg, modes, speedups, tf.ladderSLOMS, errOut)
	if err != nil && ctx.Err() != nil {
		return errors.New("twin: ladder interrupted")
	}
	if err != nil {
		return err
	}
	if err := l.WriteTable(out); err != nil {
		return err
	}
	if tf.out == "" {
		return nil
	}
	paths, err := l.WriteCharts(tf.out)
	for _, p := range paths {
		fmt.Fprintf(errOut, "twin: wrote %s\n", p)
	}
	return err
}
