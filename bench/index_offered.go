package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/internal/cputime"
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
	Why               OfferedWhy
}

// OfferedWhy splits the finds' latency from their due time into where it
// went, to tell the index's share from the harness's and the machine's.
// Per find: Queue is the time from when it was due until a finder took it
// (every finder was busy: bursts of the timeline, more finds due than
// goroutines to run them); Sched the time from when it could have started
// (due, and a finder holding it) until it did (a sleep's overshoot or
// waiting for a core); Service the find itself, start to end (wall time,
// so it also counts being descheduled mid-find).
type OfferedWhy struct {
	QueueP99, SchedP50, SchedP99, ServiceP50, ServiceP99 time.Duration
	// Tail is the mean of each part over the finds at or above the p99
	// latency: which one makes the tail.
	TailQueue, TailSched, TailService time.Duration
	// ApplyMax is the longest single event application; EventLagP99 how
	// far behind its due time an event started (p99).
	ApplyMax, EventLagP99 time.Duration
	GCs                   uint32        // GC cycles during the replay
	SchedLatP99           time.Duration // runtime/metrics /sched/latencies:seconds over the replay: runnable until running
	// OSWait is the time the process's threads waited for a core in the
	// kernel's run queue during the replay (Linux schedstat run_delay;
	// 0 elsewhere): other processes' turns on a shared machine, which no
	// Go-level yield can give back.
	OSWait time.Duration
	// CPU is the process's CPU time over the replay, every thread's: the
	// index's work, the waits' spins and syscalls, the runtime's.
	CPU time.Duration
}

// osRunDelay sums run_delay (ns runnable but not running) over the
// process's threads from /proc/self/task/*/schedstat; 0 off Linux.
func osRunDelay() time.Duration {
	ds, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0
	}
	var sum int64
	for _, d := range ds {
		b, err := os.ReadFile("/proc/self/task/" + d.Name() + "/schedstat")
		if err != nil {
			continue // the thread exited
		}
		var run, wait int64
		if _, err := fmt.Sscan(string(b), &run, &wait); err == nil {
			sum += wait
		}
	}
	return time.Duration(sum)
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
// goroutines taking the finds in due order, each the next one when free.
func replayOffered(ctx context.Context, ops []op, rate float64, groups, finders int, cold bool) (OfferedRun, error) {
	ix := index.NewSharded(groups, index.Config{})
	sched := schedule(ops, rate)
	evs := make([][]timed, groups)
	var fs []timed
	for _, t := range sched {
		if t.op.find != nil {
			fs = append(fs, t)
		} else {
			g := ix.ShardOf(t.op.event.Worker)
			evs[g] = append(evs[g], t)
		}
	}
	// Every goroutine is ready before the clock starts.
	start := time.Now().Add(2 * time.Millisecond)
	// Per find: due, start and end, from start; per event: its lag and
	// its application time.
	type span struct{ due, took, beg, end time.Duration }
	fspans := make([][]span, finders)
	var next atomic.Int64 // the next find to take
	elag := make([][]time.Duration, groups)
	eapply := make([]time.Duration, groups)
	ends := make([]time.Time, groups+finders)
	sl0, os0, cpu0 := readSchedLat(), osRunDelay(), cputime.Process()
	var ms0 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	var wg sync.WaitGroup
	for g := range evs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := newDueWaiter()
			defer w.close()
			lag := make([]time.Duration, 0, len(evs[g]))
			var worst time.Duration
			for i, t := range evs[g] {
				if i%1024 == 0 && ctx.Err() != nil {
					return
				}
				w.wait(start.Add(t.due))
				b := time.Now()
				ix.Apply(t.op.event)
				e := time.Now()
				lag = append(lag, b.Sub(start)-t.due)
				worst = max(worst, e.Sub(b))
				// A writer behind its timeline would otherwise run
				// its backlog until the Go scheduler preempts it (a
				// 10 ms slice), while finds due meanwhile wait for a
				// core: on two cores two such writers starve the
				// finders. Yielding between batches lets them run, as
				// an event subscriber that reads batches off the
				// network does.
				runtime.Gosched()
			}
			elag[g], eapply[g] = lag, worst
			ends[g] = time.Now()
		}()
	}
	// Finders take the finds in due order from one cursor, so a find
	// waits for a goroutine only when every finder is busy (dealing them
	// out in turn queued a find behind its own goroutine's earlier ones
	// while another finder was free).
	for f := range fspans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := newDueWaiter()
			defer w.close()
			var dst []index.Match
			sp := make([]span, 0, len(fs)/finders+1)
			for {
				i := int(next.Add(1) - 1)
				if i >= len(fs) {
					break
				}
				if i%1024 == 0 && ctx.Err() != nil {
					return
				}
				t := fs[i]
				took := time.Since(start)
				if !cold {
					warmQuery(t.op.find) // the router hashed the prompt before it asks
				}
				w.wait(start.Add(t.due))
				b := time.Now()
				dst = ix.FindMatches(t.op.find, dst[:0])
				sp = append(sp, span{due: t.due, took: took, beg: b.Sub(start), end: time.Since(start)})
			}
			fspans[f] = sp
			ends[groups+f] = time.Now()
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return OfferedRun{}, err
	}
	var ms1 runtime.MemStats
	runtime.ReadMemStats(&ms1)
	sl1, os1, cpu1 := readSchedLat(), osRunDelay(), cputime.Process()
	end := start
	for _, e := range ends {
		if e.After(end) {
			end = e
		}
	}
	// Latency from due time, split: queue behind the goroutine's own
	// earlier finds, waiting to run once free, the find itself.
	var all, queue, waits, service []time.Duration
	type part struct{ lat, q, s, v time.Duration }
	var parts []part
	for _, sp := range fspans {
		for _, x := range sp {
			free := max(x.due, x.took)
			p := part{lat: x.end - x.due, q: free - x.due, s: max(0, x.beg-free), v: x.end - x.beg}
			parts = append(parts, p)
			all, queue, waits, service = append(all, p.lat), append(queue, p.q), append(waits, p.s), append(service, p.v)
		}
	}
	wall := end.Sub(start)
	run := OfferedRun{Offered: rate, Ops: len(ops), Wall: wall, Achieved: float64(len(ops)) / wall.Seconds()}
	if len(all) > 0 {
		run.FindP50, run.FindP99 = percentile(all, 0.5), percentile(all, 0.99)
		w := &run.Why
		w.QueueP99, w.SchedP50, w.SchedP99 = percentile(queue, 0.99), percentile(waits, 0.5), percentile(waits, 0.99)
		w.ServiceP50, w.ServiceP99 = percentile(service, 0.5), percentile(service, 0.99)
		n := 0
		for _, p := range parts {
			if p.lat >= run.FindP99 {
				w.TailQueue, w.TailSched, w.TailService = w.TailQueue+p.q, w.TailSched+p.s, w.TailService+p.v
				n++
			}
		}
		if n > 0 {
			w.TailQueue, w.TailSched, w.TailService = w.TailQueue/time.Duration(n), w.TailSched/time.Duration(n), w.TailService/time.Duration(n)
		}
	}
	var lags []time.Duration
	for g := range elag {
		lags = append(lags, elag[g]...)
		run.Why.ApplyMax = max(run.Why.ApplyMax, eapply[g])
	}
	if len(lags) > 0 {
		run.Why.EventLagP99 = percentile(lags, 0.99)
	}
	run.Why.GCs = ms1.NumGC - ms0.NumGC
	run.Why.SchedLatP99 = schedLatQuantile(sl0, sl1, 0.99)
	run.Why.OSWait = max(0, os1-os0)
	run.Why.CPU = cpu1 - cpu0
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

// schedLat is runtime/metrics' histogram of the time goroutines spent
// runnable before they ran.
const schedLat = "/sched/latencies:seconds"

func readSchedLat() *metrics.Float64Histogram {
	m := []metrics.Sample{{Name: schedLat}}
	metrics.Read(m)
	if m[0].Value.Kind() != metrics.KindFloat64Histogram {
		return nil
	}
	return m[0].Value.Float64Histogram()
}

// schedLatQuantile is the q quantile of the latencies counted between two
// reads of the histogram (a bucket's upper bound).
func schedLatQuantile(a, b *metrics.Float64Histogram, q float64) time.Duration {
	if a == nil || b == nil || len(a.Counts) != len(b.Counts) {
		return 0
	}
	var total uint64
	for i := range b.Counts {
		total += b.Counts[i] - a.Counts[i]
	}
	if total == 0 {
		return 0
	}
	want := uint64(q * float64(total))
	var sum uint64
	for i := range b.Counts {
		sum += b.Counts[i] - a.Counts[i]
		if sum > want {
			up := b.Buckets[i+1]
			if math.IsInf(up, 1) {
				up = b.Buckets[i]
			}
			return time.Duration(up * float64(time.Second))
		}
	}
	return 0
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
		w := r.Why
		fmt.Fprintf(out, "  finds: queued for a free finder p99 %s, waiting to start (wake-up, a core) p50 %s p99 %s, the find itself p50 %s p99 %s; the slowest 1%%: %s + %s + %s; events: lag p99 %s, longest apply %s; %d GCs; goroutine run-queue wait p99 %s; threads waiting for a core (kernel run queue) %.1f ms of %.1f ms wall; process CPU %.1f ms\n",
			us(w.QueueP99), us(w.SchedP50), us(w.SchedP99), us(w.ServiceP50), us(w.ServiceP99), us(w.TailQueue), us(w.TailSched), us(w.TailService), us(w.EventLagP99), us(w.ApplyMax), w.GCs, us(w.SchedLatP99), float64(w.OSWait.Microseconds())/1000, float64(r.Wall.Microseconds())/1000, float64(w.CPU.Microseconds())/1000)
	}
}

// us prints d in µs.
func us(d time.Duration) string { return fmt.Sprintf("%.1f µs", float64(d.Nanoseconds())/1000) }

// matcher is what verify compares with the reference: an Index or a
// Sharded.
type matcher interface {
	BlockCounts(kv.WorkerKey) [kv.NumTiers]int
	Workers() []kv.WorkerKey
	FindMatches([]kv.LocalHash, []index.Match) []index.Match
}
