package main

import (
	"fmt"
	"os"
	"os/signal"

	"github.com/spf13/cobra"

	"github.com/kvmesh/kvmesh/bench"
)

func init() {
	var c bench.IndexConfig
	cmd := &cobra.Command{
		Use:   "index --trace PATH",
		Short: "Replay a Mooncake trace against the KV index and report ops/s, find latency and memory",
		Long: `Partitions the trace's requests over N workers, replays each worker's
requests through an LRU prefix cache of C blocks to generate Stored/Removed
events, merges them with one FindMatches per request into a timeline, and
replays that timeline against the index (one thread, then writer + readers)
and against the naive reference model. The last line is the summary.

An op is one event batch (one Stored or Removed event, whatever its block
count) or one FindMatches; the block-ops/s column counts every stored or
removed block and every query block instead. At block size 64 a Stored
event of this trace averages ~180 blocks, so the two rates differ ~100x.
Dynamo's mooncake_bench defaults to --block-size 512.

The parallel row applies events from one goroutine per worker group
(--event-groups, each the only writer of its own index shard) while a
reader runs the finds, each after the events that precede it.

--offered-rates R1,R2,... adds one replay per rate on the trace's own
timeline rescaled to R ops/s, events from --event-groups goroutines and
finds from --find-threads (each taking the next find due when free), none
waiting for another, one line per rate:
"offered R ops/s: achieved A ops/s, find p50 X µs, p99 Y µs", find latency
counted from the op's due time, so falling behind shows. A second line
splits it: queued for a free finder, waiting to start (the wake-up, a
core), the find itself; the events' lag and longest apply; GC cycles,
the Go run-queue wait and the time the process's threads waited in the
kernel's run queue (other processes on a shared machine), and the
process's CPU time. Ops wait for their due time on a timer that wakes on
the microsecond (on Linux a timerfd), not a sleep the Go runtime rounds
up to a millisecond when the process is idle. Dynamo's indexer benchmark
spreads the trace over --workers 7000.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkInts(intFlag{"workers", int64(c.Workers), 1}, intFlag{"block-size", int64(c.BlockSize), 1},
				intFlag{"trace-block-size", int64(c.TraceBlockSize), 1}, intFlag{"cache-blocks", int64(c.CacheBlocks), 1},
				intFlag{"limit", int64(c.MaxLines), 0}, intFlag{"event-groups", int64(c.EventGroups), 0},
				intFlag{"find-threads", int64(c.FindThreads), 0}); err != nil {
				return fmt.Errorf("bench index: %w", err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			_, err := bench.RunIndex(ctx, c, cmd.OutOrStdout())
			if err != nil && ctx.Err() != nil {
				return fmt.Errorf("bench index: interrupted")
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&c.TracePath, "trace", traceFromEnv(), "Mooncake JSONL trace (env KVMESH_TRACE)")
	f.IntVar(&c.Workers, "workers", 256, "workers to partition requests over")
	f.IntVar(&c.BlockSize, "block-size", 64, "engine block size in tokens")
	f.IntVar(&c.TraceBlockSize, "trace-block-size", 512, "tokens per trace hash id")
	f.IntVar(&c.CacheBlocks, "cache-blocks", 16384, "LRU capacity per worker in blocks")
	f.IntVar(&c.MaxLines, "limit", 0, "replay only the first N trace lines (0: all)")
	f.Uint64Var(&c.Seed, "seed", 42, "seed of the request-to-worker partition")
	f.BoolVar(&c.SkipReference, "skip-reference", false, "do not replay the naive reference model")
	f.BoolVar(&c.ColdQuery, "cold-query", false, "time each find's first read of its query too (by default the query is read before the timer, as a router has just hashed it)")
	f.Float64SliceVar(&c.OfferedRates, "offered-rates", nil, "comma-separated offered rates in ops/s: one replay each on the rescaled trace timeline")
	f.IntVar(&c.EventGroups, "event-groups", 0, "goroutines applying events, one per worker group and index shard (0: GOMAXPROCS)")
	f.IntVar(&c.FindThreads, "find-threads", 0, "goroutines issuing finds in the offered replays (0: max(2, GOMAXPROCS))")
	benchCmd.AddCommand(cmd)
}
