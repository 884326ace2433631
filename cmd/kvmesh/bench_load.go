package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvmesh/kvmesh/bench"
	"github.com/kvmesh/kvmesh/twin"
)

func init() { benchCmd.AddCommand(newBenchLoadCmd()) }

// newBenchLoadCmd builds `bench load`; a constructor so tests get fresh flags.
func newBenchLoadCmd() *cobra.Command {
	var (
		c         bench.LoadConfig
		synthetic bool
		syn       bench.SyntheticConfig
		goodput   string
		ladder    string
		ladderSLO float64
		ladderTag string
	)
	cmd := &cobra.Command{
		Use:   "load --url http://HOST:PORT/v1 (--trace PATH | --synthetic) [--concurrency C | --rate R]",
		Short: "Drive an OpenAI-compatible endpoint with a trace or a shared-prefix workload and report TTFT, ITL, throughput and goodput",
		Long: `Sends streaming chat (or completions) requests to any OpenAI-compatible
endpoint and measures them the way aiperf does: TTFT, time to second token,
ITL = (latency - TTFT)/(output tokens - 1), request latency, output tokens/s,
requests/s and goodput (requests meeting every --goodput SLO).

Workloads: a Mooncake trace (--trace), whose 512-token hash ids become
fixed blocks of text so equal ids give equal prompt prefixes, or a synthetic
shared-prefix workload (--synthetic: G groups × P prompts, a shared system
prompt of S tokens plus a unique question of Q tokens).

Schedules: trace timestamps divided by --speedup (default for a trace),
Poisson arrivals at --rate, or a closed loop at --concurrency.

Errors are counted by HTTP status (http_503 ...) and by kind (timeout,
connection_refused, stream_error, empty_response, canceled). Ctrl-C stops
sending, gives in-flight requests --grace to finish, then prints the partial
report. --out DIR receives report.json, requests.jsonl, summary.md,
ttft_cdf.svg and latency_over_time.svg. Against a kvmesh server whose
/metrics it can read (with --api-key where that needs one), it also
reports where the server's time went: each stage of its request path
(kvmesh_request_stage_seconds) over the run, p50 and p99. The last stdout line is
"load: requests=N ok=K ttft_p50_ms=... ttft_p99_ms=... itl_p50_ms=...
output_tok_s=... goodput=...". It exits 1 when no request succeeded.

--ladder 1,2,4,8 replays the trace once per speedup (ascending), each step
with prompts of its own (a salt mixed into the block ids, so every step
meets a cold cache, as each twin replay starts a fresh fleet), and prints
the twin's ladder table for the server's mode (--ladder-mode names it):
hit (the server's cached_tokens), reachable and the router queue's mean
wait (from a kvmesh server's /metrics), TTFT p50/p90/p99/mean, req/s; then
  load: capacity mode=<m> p90_ttft_le_ms=<slo> max_speedup=<x>
the highest speedup whose p90 TTFT stayed under --ladder-slo-ms with every
request served. With --out, step S writes its outputs to OUT/speedup-S.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if synthetic {
				c.Synthetic = &syn
			}
			// The library reads a zero speedup as its default; from the
			// command line it is a mistake, like every zero value.
			if !(c.Speedup > 0) {
				return fmt.Errorf("--speedup %v: want > 0", c.Speedup)
			}
			if c.TracePath == "" && !synthetic {
				c.TracePath = traceFromEnv()
			}
			slos, err := bench.ParseSLOs(goodput)
			if err != nil {
				return err
			}
			c.Goodput = slos
			c.Progress = cmd.ErrOrStderr()
			if f, ok := c.Progress.(*os.File); ok {
				if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
					c.ProgressTTY = true
				}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			go func() {
				// After the first Ctrl-C a second one kills the process.
				<-ctx.Done()
				stop()
			}()
			if ladder != "" {
				return runLoadLadder(ctx, cmd, c, ladder, ladderTag, ladderSLO)
			}
			rep, err := bench.RunLoad(ctx, c, cmd.OutOrStdout())
			if err != nil {
				return err
			}
			if rep.Interrupted != "" {
				return errors.New("bench load interrupted (" + rep.Interrupted + "): the report above is partial")
			}
			if rep.Requests > 0 && rep.OK == 0 {
				// A report of zeros is no measurement: fail so scripts notice.
				return fmt.Errorf("bench load: none of %d requests succeeded (errors: %s)", rep.Requests, errorKinds(rep.Errors))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&c.URL, "url", os.Getenv("KVMESH_LOAD_URL"), "OpenAI-compatible API base, e.g. http://localhost:8000/v1 (env KVMESH_LOAD_URL)")
	f.StringVar(&c.Model, "model", "", "model name (default: the first of GET /models)")
	f.StringVar(&c.Endpoint, "endpoint", "chat", "chat or completions")
	f.StringVar(&c.APIKey, "api-key", os.Getenv("KVMESH_API_KEY"), "bearer token (env KVMESH_API_KEY)")
	f.StringVar(&c.TracePath, "trace", "", "Mooncake JSONL trace to replay (env KVMESH_TRACE unless --synthetic)")
	f.Float64Var(&c.Speedup, "speedup", 1, "divide trace timestamps by this")
	f.BoolVar(&c.Strict, "strict", false, "fail on the first malformed trace line instead of skipping it")
	f.IntVar(&c.TraceBlockSize, "trace-block-size", 512, "tokens per trace hash id")
	f.BoolVar(&synthetic, "synthetic", false, "synthetic shared-prefix workload instead of a trace")
	f.IntVar(&syn.Groups, "groups", 64, "synthetic: prefix groups")
	f.IntVar(&syn.PromptsPerGroup, "prompts-per-group", 16, "synthetic: prompts per group")
	f.IntVar(&syn.SystemLen, "system-len", 2048, "synthetic: shared system prompt tokens")
	f.IntVar(&syn.QuestionLen, "question-len", 128, "synthetic: unique question tokens")
	f.IntVar(&syn.OutputLen, "output-len", 256, "synthetic: max output tokens")
	f.IntVar(&c.Concurrency, "concurrency", 0, "closed loop with this many requests in flight")
	f.Float64Var(&c.Rate, "rate", 0, "open loop, Poisson arrivals per second")
	f.IntVar(&c.MaxInFlight, "max-inflight", 4096, "open loop: most requests in flight")
	f.IntVar(&c.Requests, "requests", 0, "stop after N requests (0: the whole workload)")
	f.Uint64Var(&c.Seed, "seed", 42, "seed of Poisson arrivals and the synthetic order")
	f.BoolVar(&c.IgnoreEOS, "ignore-eos", false, "send min_tokens=max_tokens and ignore_eos so every answer has the full length")
	f.StringVar(&goodput, "goodput", "", `SLOs for goodput, e.g. "ttft_ms<=2000,itl_ms<=25" (also latency_ms, ttst_ms, tps_user>=X, aiperf's name:value)`)
	f.DurationVar(&c.Timeout, "timeout", 10*time.Minute, "per-request timeout")
	f.DurationVar(&c.Duration, "duration", 0, "stop sending after this long (0: no limit)")
	f.DurationVar(&c.Grace, "grace", 5*time.Second, "after Ctrl-C or --duration, how long in-flight requests may finish")
	f.DurationVar(&c.ProgressEvery, "progress-every", 5*time.Second, "progress line interval when stderr is not a terminal")
	f.StringVar(&c.OutDir, "out", "", "write report.json, requests.jsonl, summary.md and SVG plots here")
	f.StringVar(&ladder, "ladder", "", "replay the trace once per speedup in this comma-separated list (e.g. 1,2,4,8) and print the capacity table")
	f.Float64Var(&ladderSLO, "ladder-slo-ms", twin.DefaultLadderSLOMS, "ladder: a step is within capacity while its p90 TTFT stays under this (ms)")
	f.StringVar(&ladderTag, "ladder-mode", "server", "ladder: the mode column, naming what the server runs (e.g. kv+queue)")
	return cmd
}

// runLoadLadder runs `bench load --ladder`: a step per speedup, then the
// table and the capacity line on stdout.
func runLoadLadder(ctx context.Context, cmd *cobra.Command, c bench.LoadConfig, spec, mode string, sloMS float64) error {
	speedups, err := twin.ParseLadder(spec)
	if err != nil {
		return fmt.Errorf("--ladder: %w", err)
	}
	if !(sloMS > 0) {
		return fmt.Errorf("--ladder-slo-ms %v: want > 0", sloMS)
	}
	l, err := bench.RunLoadLadder(ctx, c, speedups, mode, sloMS, cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	if err := l.WriteTable(cmd.OutOrStdout()); err != nil {
		return err
	}
	for _, s := range l.Steps {
		if s.Report.Interrupted != "" {
			return errors.New("bench load interrupted (" + s.Report.Interrupted + "): the ladder above is partial")
		}
		if s.Report.Requests > 0 && s.Report.OK == 0 {
			return fmt.Errorf("bench load: ladder speedup %g: none of %d requests succeeded (errors: %s)", s.Speedup, s.Report.Requests, errorKinds(s.Report.Errors))
		}
	}
	return nil
}

// errorKinds lists error counts by kind, most frequent first.
func errorKinds(m map[string]int) string {
	kinds := make([]string, 0, len(m))
	for k := range m {
		kinds = append(kinds, k)
	}
	slices.SortFunc(kinds, func(a, b string) int {
		if m[a] != m[b] {
			return m[b] - m[a]
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}
