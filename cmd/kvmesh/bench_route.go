package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/kvmesh/kvmesh/internal/quantile"
	"github.com/kvmesh/kvmesh/router"
)

// benchRouteConfig is `kvmesh bench route`'s flags.
type benchRouteConfig struct {
	fleet      router.BenchFleetConfig
	iterations int
	warmup     int
	inFlight   int
	hints      bool
}

func init() { benchCmd.AddCommand(newBenchRouteCmd()) }

func newBenchRouteCmd() *cobra.Command {
	var c benchRouteConfig
	cmd := &cobra.Command{
		Use:   "route",
		Short: "Time one routing decision (hash + match + cost) over a warm index",
		Long: `Builds an event index in which every worker holds varied prefixes of a set
of prompts on varied tiers, then times Route for those prompts many times
with a window of requests in flight (so the load model is exercised), and
prints latency percentiles and the per-stage means from the router's own
metrics. The last line is "route: p50 <x> µs, p99 <y> µs".`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			return runBenchRoute(ctx, c, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.IntVar(&c.fleet.Workers, "workers", 64, "worker keys in the fleet")
	f.IntVar(&c.fleet.PromptTokens, "prompt-tokens", 8192, "tokens per prompt")
	f.IntVar(&c.fleet.Prompts, "prompts", 32, "distinct prompts")
	f.IntVar(&c.fleet.BlockSize, "block-size", 64, "KV block size in tokens (64, as serve, twin and bench index)")
	f.IntVar(&c.fleet.HeldPerWorker, "held", 8, "prompt prefixes each worker holds")
	f.Uint64Var(&c.fleet.Seed, "seed", 1, "seed of the fleet and the tie-breaks")
	f.IntVar(&c.iterations, "iterations", 20000, "timed routing decisions")
	f.IntVar(&c.warmup, "warmup", 2000, "untimed decisions first")
	f.IntVar(&c.inFlight, "in-flight", 128, "decisions kept open (their load counts) before the oldest is done")
	f.BoolVar(&c.hints, "hints", true, "plan KV hints too")
	return cmd
}

func runBenchRoute(ctx context.Context, c benchRouteConfig, out io.Writer) error {
	if c.iterations <= 0 || c.warmup < 0 || c.inFlight < 0 {
		return fmt.Errorf("bench route: --iterations must be positive, --warmup and --in-flight not negative")
	}
	// The fleet reads a zero size as its default; here it is a mistake.
	if err := checkInts(intFlag{"workers", int64(c.fleet.Workers), 1}, intFlag{"prompt-tokens", int64(c.fleet.PromptTokens), 1},
		intFlag{"prompts", int64(c.fleet.Prompts), 1}, intFlag{"block-size", int64(c.fleet.BlockSize), 1},
		intFlag{"held", int64(c.fleet.HeldPerWorker), 1}); err != nil {
		return fmt.Errorf("bench route: %w", err)
	}
	reg := prometheus.NewRegistry()
	start := time.Now()
	f, err := router.NewBenchFleet(c.fleet, router.Config{Hints: c.hints, Registerer: reg})
	if err != nil {
		return fmt.Errorf("bench route: %w", err)
	}
	st := f.Index.Stats()
	fmt.Fprintf(out, "fleet: %d workers, %d prompts of %d tokens, index of %d nodes / %d holdings built in %v\n",
		len(f.Router.Workers("bench", "")), len(f.Prompts), len(f.Prompts[0]), st.Nodes, st.Holdings,
		time.Since(start).Round(time.Millisecond))

	open := make([]*router.Decision, 0, c.inFlight+1)
	lat := make([]time.Duration, 0, c.iterations)
	var stages [3][]time.Duration // hash, match, score+book
	var cached, isl, hinted int
	for i := 0; i < c.warmup+c.iterations; i++ {
		if i%1024 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		req := router.Request{Model: "bench", Tokens: f.Prompts[i%len(f.Prompts)]}
		t := time.Now()
		d, err := f.Router.Route(ctx, req)
		el := time.Since(t)
		if err != nil {
			return fmt.Errorf("bench route: decision %d: %w", i, err)
		}
		if i >= c.warmup {
			lat = append(lat, el)
			stages[0] = append(stages[0], d.Timing.Hash)
			stages[1] = append(stages[1], d.Timing.Match)
			stages[2] = append(stages[2], d.Timing.Score)
			cached += d.CachedTokens
			isl += d.ISL
			if d.Hint != nil {
				hinted++
			}
		}
		d.FirstToken()
		open = append(open, d)
		if len(open) > c.inFlight {
			open[0].Done()
			open = append(open[:0], open[1:]...)
		}
	}
	for _, d := range open {
		d.Done()
	}

	pctOf := func(v []time.Duration, p float64) float64 {
		return float64(quantile.Nearest(v, p).Nanoseconds()) / 1e3
	}
	for _, s := range stages {
		slices.Sort(s)
	}
	slices.Sort(lat)
	pct := func(p float64) float64 { return pctOf(lat, p) }
	var sum time.Duration
	for _, l := range lat {
		sum += l
	}
	fmt.Fprintf(out, "decisions: %d, predicted hit rate %.1f%%, hinted %.1f%%\n",
		len(lat), 100*float64(cached)/float64(max(isl, 1)), 100*float64(hinted)/float64(len(lat)))
	fmt.Fprintf(out, "stages p50/p99: hash %.1f/%.1f µs, match %.1f/%.1f µs, score+book %.1f/%.1f µs\n",
		pctOf(stages[0], 0.5), pctOf(stages[0], 0.99), pctOf(stages[1], 0.5), pctOf(stages[1], 0.99),
		pctOf(stages[2], 0.5), pctOf(stages[2], 0.99))
	if means, err := stageMeans(reg); err == nil {
		fmt.Fprintf(out, "router metrics (mean, incl. warmup): hash %.1f µs, match %.1f µs, score+book %.1f µs\n",
			means["hash"], means["match"], means["score"])
	}
	fmt.Fprintf(out, "latency: mean %.1f µs, p90 %.1f µs, p99.9 %.1f µs, max %.1f µs\n",
		float64(sum.Nanoseconds())/float64(len(lat))/1e3, pct(0.90), pct(0.999), float64(lat[len(lat)-1].Nanoseconds())/1e3)
	fmt.Fprintf(out, "route: p50 %.1f µs, p99 %.1f µs\n", pct(0.50), pct(0.99))
	return nil
}

// stageMeans reads the router's overhead histogram: mean µs per stage.
func stageMeans(reg *prometheus.Registry) (map[string]float64, error) {
	fams, err := reg.Gather()
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "kvmesh_router_overhead_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			h := m.GetHistogram()
			if h.GetSampleCount() > 0 && len(m.GetLabel()) > 0 {
				out[m.GetLabel()[0].GetValue()] = h.GetSampleSum() / float64(h.GetSampleCount()) * 1e6
			}
		}
	}
	return out, nil
}
