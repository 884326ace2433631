package bench

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/kv"
)

// OfferedRun is one replay at an offered rate: the trace's timeline
// rescaled so that its ops arrive at Offered ops/s on average, events from
// one goroutine per worker group and finds from several, none waiting for
// another. A find's latency runs from the time it was due, so an index (or
// a machine) that falls behind shows it.
type OfferedRun struct {
	Offered, Achieved float64 // ops/s
	Ops               int
	Wall              time.Duration // first op due until the last one done
	FindP50, FindP99  time.Duration
}

// spinBelow is how close to an op's due time a goroutine stops sleeping
// and yields in a loop instead (a sleep overshoots by tens of µs).
const spinBelow = 200 * time.Microsecond

func waitUntil(t time.Time) {
	for {
		d := time.Until(t)
		if d <= 0 {
			return
		}
		if d > spinBelow {
			time.Sleep(d - spinBelow)
		} else {
			runtime.Gosched()
		}
	}
}

// timed is an op with its due time from the replay's start.
type timed struct {
	due time.Duration
	op  *op
}

// schedule rescales the ops' trace times so that they span len(ops)/rate
// seconds.
func schedule(ops []op, rate float64) []timed {
	out := make([]timed, len(ops))
	if len(ops) == 0 {
		return out
	}
	t0, span := ops[0].at, ops[len(ops)-1].at-ops[0].at
	total := float64(len(ops)) / rate * float64(time.Second)
	for i := range ops {
		var d time.Duration
		if span > 0 {
			d = time.Duration(float64(ops[i].at-t0) / float64(span) * total)
		}
		out[i] = timed{due: d, op: &ops[i]}
	}
	return out
}

// replayOffered replays ops at rate against a fresh sharded index: one
// event goroutine per group (the only writer of its shard), finders
// goroutines taking finds in turn.
func replayOffered(ctx context.Context, ops []op, rate float64, groups, finders int, cold bool) (OfferedRun, error) {
	ix := index.NewSharded(groups, index.Config{})
	sched := schedule(ops, rate)
	evs := make([][]timed, groups)
	fs := make([][]timed, finders)
	nf := 0
	for _, t := range sched {
		if t.op.find != nil {
			fs[nf%finders] = append(fs[nf%finders], t)
			nf++
		} else {
			g := ix.ShardOf(t.op.event.Worker)
			evs[g] = append(evs[g], t)
		}
	}
	// Every goroutine is ready before the clock starts.
	start := time.Now().Add(2 * time.Millisecond)
	lats := make([][]time.Duration, finders)
	ends := make([]time.Time, groups+finders)
	var wg sync.WaitGroup
	for g := range evs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, t := range evs[g] {
				if i%1024 == 0 && ctx.Err() != nil {
					return
				}
				waitUntil(start.Add(t.due))
				ix.Apply(t.op.event)
			}
			ends[g] = time.Now()
		}()
	}
	for f := range fs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var dst []index.Match
			lat := make([]time.Duration, 0, len(fs[f]))
			for i, t := range fs[f] {
				if i%1024 == 0 && ctx.Err() != nil {
					return
				}
				if !cold {
					warmQuery(t.op.find) // the router hashed the prompt before it asks
				}
				due := start.Add(t.due)
				waitUntil(due)
				dst = ix.FindMatches(t.op.find, dst[:0])
				lat = append(lat, time.Since(due))
			}
			lats[f] = lat
			ends[groups+f] = time.Now()
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return OfferedRun{}, err
	}
	end := start
	for _, e := range ends {
		if e.After(end) {
			end = e
		}
	}
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	wall := end.Sub(start)
	run := OfferedRun{Offered: rate, Ops: len(ops), Wall: wall, Achieved: float64(len(ops)) / wall.Seconds()}
	if len(all) > 0 {
		run.FindP50, run.FindP99 = percentile(all, 0.5), percentile(all, 0.99)
	}
	runtime.KeepAlive(ix)
	return run, nil
}

// runOffered replays ops once per rate of c.OfferedRates.
func runOffered(ctx context.Context, c IndexConfig, ops []op) ([]OfferedRun, error) {
	var out []OfferedRun
	for _, r := range c.OfferedRates {
		run, err := replayOffered(ctx, ops, r, c.EventGroups, c.FindThreads, c.ColdQuery)
		if err != nil {
			return nil, err
		}
		out = append(out, run)
	}
	return out, nil
}

func printOffered(out io.Writer, c IndexConfig, runs []OfferedRun) {
	if len(runs) == 0 {
		return
	}
	fmt.Fprintf(out, "offered load: the timeline rescaled per rate; events from %d goroutines (one per worker group and index shard), finds from %d; find latency from the op's due time\n",
		c.EventGroups, c.FindThreads)
	for _, r := range runs {
		fmt.Fprintf(out, "offered %.0f ops/s: achieved %.0f ops/s, find p50 %.1f µs, p99 %.1f µs\n",
			r.Offered, r.Achieved, float64(r.FindP50.Nanoseconds())/1000, float64(r.FindP99.Nanoseconds())/1000)
	}
}

// matcher is what verify compares with the reference: an Index or a
// Sharded.
type matcher interface {
	BlockCounts(kv.WorkerKey) [kv.NumTiers]int
	Workers() []kv.WorkerKey
	FindMatches([]kv.LocalHash, []index.Match) []index.Match
}
