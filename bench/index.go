// Package bench holds kvmesh's benchmarks: trace replays, load generation
// and reports. This file is `kvmesh bench index`: a Mooncake-trace replay
// against the KV index, after Dynamo's mooncake_bench.
//
// It measures from the outside: it imports kv, index, trace and plot, and
// must not import the live fleet, worker or frontend (bench load talks to any
// OpenAI endpoint over HTTP).
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/index/ref"
	"github.com/kvmesh/kvmesh/internal/cputime"
	"github.com/kvmesh/kvmesh/internal/quantile"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/tracefile"
)

// IndexConfig configures the index benchmark.
type IndexConfig struct {
	TracePath      string
	Workers        int // default 256
	BlockSize      int // engine block size, default 64
	TraceBlockSize int // tokens per trace hash id, default 512
	CacheBlocks    int // LRU capacity per worker, default 16384
	MaxLines       int // 0: the whole trace
	Seed           uint64
	SkipReference  bool
	// ColdQuery times each find's first read of its query too. By default
	// the query is read just before the timer starts: the timeline holding
	// it is ~35 MB, while a router hashes the prompt just before it asks,
	// so its query is in cache.
	ColdQuery bool
	// OfferedRates, when set, adds one replay per rate (ops/s) on the
	// trace's own timeline rescaled to that rate (index_offered.go).
	OfferedRates []float64
	// EventGroups is how many goroutines apply events, each for its own
	// group of workers (one index shard each), in the parallel and the
	// offered replays; FindThreads how many issue finds in the offered
	// replays. Defaults: GOMAXPROCS, and max(2, GOMAXPROCS).
	EventGroups, FindThreads int
}

// IndexPhase is one measured replay.
//
// An op is one event batch (a Stored or Removed event, whatever its block
// count: a Stored here averages ~180 blocks at block size 64) or one
// FindMatches (whatever its query length). Block ops count the blocks
// inside them: every stored or removed block is one, and a FindMatches
// counts the blocks of its query. Dynamo's mooncake_bench reports both.
type IndexPhase struct {
	Name          string
	Threads       int
	Ops           int
	BlockOps      int
	Wall          time.Duration
	OpsPerSec     float64
	BlockOpsPerS  float64
	FindP50       time.Duration
	FindP99       time.Duration
	BytesPerHold  float64
	HeapBytes     uint64
	FindsMeasured int
	// CPU is the phase's critical path in thread CPU time: the longest
	// thread's, or all threads' over GOMAXPROCS cores if that is longer.
	// On idle cores it is the wall time; on a busy machine the wall time
	// also counts other processes' turns. Zero off Linux.
	CPU time.Duration
	// ThreadCPU is each thread's CPU time in a parallel phase: the event
	// groups' first, then the readers'.
	ThreadCPU []time.Duration
}

// BlockOpsPerCPUS is block ops per second of the phase's critical path
// in thread CPU time (0 when not measured).
func (p IndexPhase) BlockOpsPerCPUS() float64 {
	if p.CPU <= 0 {
		return 0
	}
	return float64(p.BlockOps) / p.CPU.Seconds()
}

// criticalCPU is the critical path of threads that ran for cpu each on
// procs cores.
func criticalCPU(cpu []time.Duration, procs int) time.Duration {
	var longest, sum time.Duration
	for _, c := range cpu {
		longest = max(longest, c)
		sum += c
	}
	return max(longest, sum/time.Duration(max(1, procs)))
}

// IndexResult is what RunIndex measured.
type IndexResult struct {
	Requests, Events, Finds, StoredBlocks, RemovedBlocks int
	QueryBlocks                                          int // blocks over all FindMatches queries
	Holdings                                             uint64
	Nodes                                                uint64
	Phases                                               []IndexPhase
	Verified                                             bool
	Index                                                *index.Index // the single-thread replay's final state
	Ref                                                  *ref.Index
	Offered                                              []OfferedRun
}

type op struct {
	find  []kv.LocalHash // a FindMatches query, or
	event kv.Event       // an event batch
	at    int64          // the request's arrival in the trace, ms
}

// blocks is the op's block-op count.
func (o *op) blocks() int {
	if o.find != nil {
		return len(o.find)
	}
	return len(o.event.Blocks) + len(o.event.Removed)
}

func blockOps(ops []op) int {
	n := 0
	for i := range ops {
		n += ops[i].blocks()
	}
	return n
}

func (c *IndexConfig) defaults() {
	if c.Workers <= 0 {
		c.Workers = 256
	}
	if c.BlockSize <= 0 {
		c.BlockSize = 64
	}
	if c.TraceBlockSize <= 0 {
		c.TraceBlockSize = tracefile.DefaultTraceBlockSize
	}
	if c.CacheBlocks <= 0 {
		c.CacheBlocks = 16384
	}
	if c.Seed == 0 {
		c.Seed = 42
	}
	if c.EventGroups <= 0 {
		c.EventGroups = runtime.GOMAXPROCS(0)
	}
	if c.FindThreads <= 0 {
		c.FindThreads = max(2, runtime.GOMAXPROCS(0))
	}
}

// lru is one worker's prefix cache over sequence hashes.
type lru struct {
	cap        int
	pos        map[kv.SeqHash]int32
	prev, next []int32
	key        []kv.SeqHash
	free       []int32
	head, tail int32 // head most recent
}

func newLRU(c int) *lru {
	return &lru{cap: c, pos: map[kv.SeqHash]int32{}, head: -1, tail: -1}
}

func (l *lru) unlink(i int32) {
	if l.prev[i] >= 0 {
		l.next[l.prev[i]] = l.next[i]
	} else {
		l.head = l.next[i]
	}
	if l.next[i] >= 0 {
		l.prev[l.next[i]] = l.prev[i]
	} else {
		l.tail = l.prev[i]
	}
}

func (l *lru) pushFront(i int32) {
	l.prev[i], l.next[i] = -1, l.head
	if l.head >= 0 {
		l.prev[l.head] = i
	}
	l.head = i
	if l.tail < 0 {
		l.tail = i
	}
}

func (l *lru) touch(s kv.SeqHash) {
	i := l.pos[s]
	l.unlink(i)
	l.pushFront(i)
}

// insert adds s, returning the evicted key if the cache was full.
func (l *lru) insert(s kv.SeqHash) (evicted kv.SeqHash, did bool) {
	var i int32
	if len(l.pos) >= l.cap {
		i = l.tail
		evicted, did = l.key[i], true
		delete(l.pos, evicted)
		l.unlink(i)
	} else if k := len(l.free); k > 0 {
		i = l.free[k-1]
		l.free = l.free[:k-1]
	} else {
		i = int32(len(l.key))
		l.key, l.prev, l.next = append(l.key, 0), append(l.prev, 0), append(l.next, 0)
	}
	l.key[i] = s
	l.pos[s] = i
	l.pushFront(i)
	return evicted, did
}

// buildTimeline loads the trace and generates every op (untimed).
func buildTimeline(ctx context.Context, c IndexConfig, res *IndexResult) ([]op, error) {
	reqs, errs, err := tracefile.Load(c.TracePath, tracefile.Options{TraceBlockSize: c.TraceBlockSize, MaxLines: c.MaxLines})
	if err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("%s: no valid requests (%d bad lines)", c.TracePath, len(errs))
	}
	res.Requests = len(reqs)
	r := rand.New(rand.NewPCG(c.Seed, c.Seed))
	caches := make([]*lru, c.Workers)
	for i := range caches {
		caches[i] = newLRU(c.CacheBlocks)
	}
	exp := tracefile.NewExpander(c.TraceBlockSize, c.BlockSize, kv.BaseSeed)
	ops := make([]op, 0, 3*len(reqs))
	var seq []kv.SeqHash
	for n, req := range reqs {
		if n%1024 == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		wi := r.IntN(c.Workers)
		w := kv.WorkerKey{Instance: uint64(wi + 1)}
		local := exp.LocalHashes(nil, &req)
		if len(local) == 0 {
			continue
		}
		ops = append(ops, op{find: local, at: req.TimestampMS})
		res.Finds++
		res.QueryBlocks += len(local)
		if len(local) > c.CacheBlocks {
			local = local[:c.CacheBlocks]
		}
		seq = kv.SeqHashes(seq[:0], local)
		l := caches[wi]
		var removed []kv.EngineHash // the replayed engine names blocks by sequence hash
		var stores []kv.Event
		var run *kv.Event
		for i, s := range seq {
			if _, ok := l.pos[s]; ok {
				run = nil
				continue
			}
			if ev, did := l.insert(s); did {
				removed = append(removed, kv.EngineHash(ev))
			}
			if run == nil {
				var parent *kv.EngineHash
				if i > 0 {
					p := kv.EngineHash(seq[i-1])
					parent = &p
				}
				stores = append(stores, kv.Stored(w, kv.TierDevice, parent, nil))
				run = &stores[len(stores)-1]
			}
			run.Blocks = append(run.Blocks, kv.StoredBlock{EngineHash: kv.EngineHash(s), LocalHash: local[i]})
		}
		// Recency: the request's tail is freed first, so its prefix stays
		// most recent and eviction takes leaves before shared prefixes.
		for i := len(seq) - 1; i >= 0; i-- {
			l.touch(seq[i])
		}
		if len(removed) > 0 {
			ops = append(ops, op{event: kv.Removed(w, kv.TierDevice, removed), at: req.TimestampMS})
			res.Events++
			res.RemovedBlocks += len(removed)
		}
		for _, ev := range stores {
			ops = append(ops, op{event: ev, at: req.TimestampMS})
			res.Events++
			res.StoredBlocks += len(ev.Blocks)
		}
	}
	return ops, nil
}

// querySink keeps warmQuery's loads from being optimised away.
var querySink atomic.Uint64

// warmQuery reads every hash of q, so the timed find starts with its query
// in cache as a router's does (it hashed the prompt just before).
func warmQuery(q []kv.LocalHash) {
	var x kv.LocalHash
	for _, h := range q {
		x ^= h
	}
	querySink.Store(uint64(x))
}

type finder interface {
	apply(kv.Event)
	find([]kv.LocalHash)
}

type ixRunner struct {
	ix  *index.Index
	dst []index.Match
}

func (r *ixRunner) apply(ev kv.Event)         { r.ix.Apply(ev) }
func (r *ixRunner) find(local []kv.LocalHash) { r.dst = r.ix.FindMatches(local, r.dst[:0]) }

type refRunner struct {
	rf  *ref.Index
	dst []ref.Match
}

func (r *refRunner) apply(ev kv.Event)         { r.rf.Apply(ev) }
func (r *refRunner) find(local []kv.LocalHash) { r.dst = r.rf.FindMatches(local, r.dst[:0]) }

func heapNow() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// percentile sorts d in place.
func percentile(d []time.Duration, p float64) time.Duration {
	slices.Sort(d)
	return quantile.Nearest(d, p)
}

// replay runs ops in order on one thread, timing every find. Its wall
// time leaves out the reads of queries before their finds.
func replay(ctx context.Context, name string, ops []op, f finder, cold bool) (IndexPhase, error) {
	lat := make([]time.Duration, 0, len(ops)/2)
	var warm time.Duration // reading queries before their finds: bench work, not index work
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu0 := cputime.Thread()
	start := time.Now()
	for i := range ops {
		if i%4096 == 0 && ctx.Err() != nil {
			return IndexPhase{}, ctx.Err()
		}
		if o := &ops[i]; o.find != nil {
			var t time.Time
			if !cold {
				w := time.Now()
				warmQuery(o.find)
				t = time.Now()
				warm += t.Sub(w)
			} else {
				t = time.Now()
			}
			f.find(o.find)
			lat = append(lat, time.Since(t))
		} else {
			f.apply(o.event)
		}
	}
	wall := time.Since(start) - warm
	cpu := cputime.Thread() - cpu0
	bo := blockOps(ops)
	return IndexPhase{Name: name, Threads: 1, Ops: len(ops), BlockOps: bo, Wall: wall, OpsPerSec: float64(len(ops)) / wall.Seconds(),
		BlockOpsPerS: float64(bo) / wall.Seconds(), FindP50: percentile(lat, 0.5), FindP99: percentile(lat, 0.99), FindsMeasured: len(lat), CPU: cpu}, nil
}

// goMeasured runs f on a goroutine locked to its thread and stores the
// thread CPU time f took in *cpu.
func goMeasured(wg *sync.WaitGroup, cpu *time.Duration, f func()) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		c0 := cputime.Thread()
		f()
		*cpu = cputime.Thread() - c0
	}()
}

// replayParallel applies events from one goroutine per worker group, each
// the only writer of its own index shard, while readers run the finds
// concurrently, lock-free; each find still waits for the events that
// precede it in the timeline.
func replayParallel(ctx context.Context, ops []op, groups, readers int, cold bool) (IndexPhase, *index.Sharded, error) {
	ix := index.NewSharded(groups, index.Config{})
	evs := make([][]kv.Event, groups)
	var finds [][]kv.LocalHash
	var after []int64 // per find and group: the group's events that precede it
	for i := range ops {
		if ops[i].find != nil {
			finds = append(finds, ops[i].find)
			for g := range evs {
				after = append(after, int64(len(evs[g])))
			}
		} else {
			g := ix.ShardOf(ops[i].event.Worker)
			evs[g] = append(evs[g], ops[i].event)
		}
	}
	// A reader that runs ahead of the writers sleeps on a condition
	// variable instead of spinning: on a small machine a spinning reader
	// takes a writer's core.
	applied := make([]atomic.Int64, groups)
	var waiting atomic.Int32
	var mu sync.Mutex
	cond := sync.NewCond(&mu)
	stopped := false // a writer gave up (cancelled)
	wake := func() {
		mu.Lock()
		cond.Broadcast()
		mu.Unlock()
	}
	caughtUp := func(need []int64) bool {
		for g, n := range need {
			if applied[g].Load() < n {
				return false
			}
		}
		return true
	}
	waitFor := func(need []int64) bool {
		for spin := 0; spin < 64; spin++ {
			if caughtUp(need) {
				return true
			}
		}
		mu.Lock()
		defer mu.Unlock()
		waiting.Add(1)
		defer waiting.Add(-1)
		for !caughtUp(need) {
			if stopped {
				return false
			}
			cond.Wait()
		}
		return true
	}
	lats := make([][]time.Duration, readers)
	cpu := make([]time.Duration, groups+readers)
	var wg sync.WaitGroup
	start := time.Now()
	for g := range evs {
		goMeasured(&wg, &cpu[g], func() {
			for i, ev := range evs[g] {
				if i%4096 == 0 && ctx.Err() != nil {
					mu.Lock()
					stopped = true
					cond.Broadcast()
					mu.Unlock()
					return
				}
				ix.Apply(ev)
				applied[g].Store(int64(i + 1))
				if waiting.Load() != 0 {
					wake()
				}
			}
		})
	}
	for r := 0; r < readers; r++ {
		goMeasured(&wg, &cpu[groups+r], func() {
			var dst []index.Match
			lat := make([]time.Duration, 0, len(finds)/readers+1)
			for i := r; i < len(finds); i += readers {
				// Keep timeline order: a find waits for the events before it.
				if !waitFor(after[i*groups : (i+1)*groups]) {
					return // a writer stopped (cancelled)
				}
				if !cold {
					warmQuery(finds[i])
				}
				t := time.Now()
				dst = ix.FindMatches(finds[i], dst[:0])
				lat = append(lat, time.Since(t))
			}
			lats[r] = lat
		})
	}
	wg.Wait()
	wall := time.Since(start)
	if err := ctx.Err(); err != nil {
		return IndexPhase{}, nil, err
	}
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	bo := blockOps(ops)
	return IndexPhase{Name: "index, parallel", Threads: groups + readers, Ops: len(ops), BlockOps: bo, Wall: wall, OpsPerSec: float64(len(ops)) / wall.Seconds(),
		BlockOpsPerS: float64(bo) / wall.Seconds(), FindP50: percentile(all, 0.5), FindP99: percentile(all, 0.99), FindsMeasured: len(all),
		CPU: criticalCPU(cpu, runtime.GOMAXPROCS(0)), ThreadCPU: cpu}, ix, nil
}

// maxThreads bounds --event-groups and --find-threads.
const maxThreads = 1024

// RunIndex builds the timeline, replays it against the index (one thread,
// then writer + readers in parallel) and the reference model, checks they
// agree, and prints a table ending with the summary line.
func RunIndex(ctx context.Context, c IndexConfig, out io.Writer) (*IndexResult, error) {
	c.defaults()
	if c.TracePath == "" {
		return nil, errors.New("bench index: --trace is required")
	}
	for _, r := range c.OfferedRates {
		if !(r > 0) || r > 1e12 {
			return nil, fmt.Errorf("bench index: --offered-rates: %v is not a rate in ops/s (want > 0)", r)
		}
	}
	if c.EventGroups > maxThreads {
		return nil, fmt.Errorf("bench index: --event-groups %d: want at most %d", c.EventGroups, maxThreads)
	}
	if c.FindThreads > maxThreads {
		return nil, fmt.Errorf("bench index: --find-threads %d: want at most %d", c.FindThreads, maxThreads)
	}
	res := &IndexResult{}
	ops, err := buildTimeline(ctx, c, res)
	if err != nil {
		return nil, err
	}

	base := heapNow()
	ir := &ixRunner{ix: index.New()}
	single, err := replay(ctx, "index, 1 thread", ops, ir, c.ColdQuery)
	if err != nil {
		return nil, err
	}
	ixHeap := heapNow() - base
	st := ir.ix.Stats()
	res.Holdings, res.Nodes, res.Index = st.Holdings, st.Nodes, ir.ix
	single.HeapBytes = ixHeap
	if st.Holdings > 0 {
		single.BytesPerHold = float64(ixHeap) / float64(st.Holdings)
	}
	res.Phases = append(res.Phases, single)

	readers := max(1, runtime.GOMAXPROCS(0)-1)
	base = heapNow()
	par, sharded, err := replayParallel(ctx, ops, c.EventGroups, readers, c.ColdQuery)
	if err != nil {
		return nil, err
	}
	par.HeapBytes = heapNow() - base
	if h := sharded.Stats().Holdings; h > 0 {
		par.BytesPerHold = float64(par.HeapBytes) / float64(h)
	}
	res.Phases = append(res.Phases, par)

	if !c.SkipReference {
		before := heapNow()
		rr := &refRunner{rf: ref.New()}
		rp, err := replay(ctx, "reference, 1 thread", ops, rr, c.ColdQuery)
		if err != nil {
			return nil, err
		}
		rp.HeapBytes = heapNow() - before
		if st.Holdings > 0 {
			rp.BytesPerHold = float64(rp.HeapBytes) / float64(st.Holdings)
		}
		res.Phases = append(res.Phases, rp)
		res.Ref = rr.rf
		res.Verified = verify(ir.ix, rr.rf, ops) && verify(sharded, rr.rf, ops)
	}
	if res.Offered, err = runOffered(ctx, c, ops); err != nil {
		return nil, err
	}
	runtime.KeepAlive(ops)

	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(out, "trace %s: %d requests, %d workers, block %d, cache %d blocks/worker\n", c.TracePath, res.Requests, c.Workers, c.BlockSize, c.CacheBlocks)
	fmt.Fprintf(out, "timeline: %d ops = %d finds + %d event batches (%d blocks stored, %d removed); %d block ops (%.1f per op)\n",
		len(ops), res.Finds, res.Events, res.StoredBlocks, res.RemovedBlocks, single.BlockOps, float64(single.BlockOps)/float64(max(1, len(ops))))
	fmt.Fprintf(out, "final: %d holdings on %d nodes; %d nodes with >2 holders share %d holder sets\n", res.Holdings, res.Nodes, st.Overflow, st.HolderSets)
	fmt.Fprintln(out, "op = one event batch (any block count) or one FindMatches; block op = one stored/removed block or one query block")
	if c.ColdQuery {
		fmt.Fprintln(out, "find latency includes the first read of the query from the timeline (--cold-query)")
	} else {
		fmt.Fprintln(out, "find latency starts with the query read once (in cache, as after a router hashes the prompt)")
	}
	fmt.Fprintln(out, "cpu ms = the phase's critical path in thread CPU time (its wall time on idle cores; a busy machine's wall time also counts other processes)")
	fmt.Fprintln(tw, "phase\tthreads\tops/s\tblock-ops/s\twall ms\tcpu ms\tblock-ops/cpu-s\tfind p50 µs\tfind p99 µs\tB/holding\t")
	for _, p := range res.Phases {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.0f\t%.1f\t%.1f\t%.0f\t%.2f\t%.2f\t%.1f\t\n", p.Name, p.Threads, p.OpsPerSec, p.BlockOpsPerS, float64(p.Wall.Microseconds())/1000,
			float64(p.CPU.Microseconds())/1000, p.BlockOpsPerCPUS(), float64(p.FindP50.Nanoseconds())/1000, float64(p.FindP99.Nanoseconds())/1000, p.BytesPerHold)
	}
	tw.Flush()
	if len(par.ThreadCPU) == par.Threads && c.EventGroups < par.Threads {
		// Which thread bounds the parallel row (its cpu ms is the
		// longest of these, or their sum over the cores if that is more).
		ms := func(d []time.Duration) string {
			var b strings.Builder
			for i, x := range d {
				if i > 0 {
					b.WriteString(", ")
				}
				fmt.Fprintf(&b, "%.1f", float64(x.Microseconds())/1000)
			}
			return b.String()
		}
		fmt.Fprintf(out, "parallel row, thread CPU ms: event groups %s; readers %s\n", ms(par.ThreadCPU[:c.EventGroups]), ms(par.ThreadCPU[c.EventGroups:]))
	}
	ratio := 0.0
	if len(res.Phases) > 2 && res.Phases[2].OpsPerSec > 0 {
		ratio = single.OpsPerSec / res.Phases[2].OpsPerSec
		fmt.Fprintf(out, "reference check: %v (block counts of every worker and every find of the trace, 1-thread and sharded)\n", map[bool]string{true: "index equals reference", false: "MISMATCH"}[res.Verified])
	}
	printOffered(out, c, res.Offered)
	best := single
	if par.OpsPerSec > best.OpsPerSec {
		best = par
	}
	fmt.Fprintf(out, "index: %.0f ops/s, find p99 %.2f µs, %.1f B/holding, %.1fx vs reference\n",
		best.OpsPerSec, float64(best.FindP99.Nanoseconds())/1000, single.BytesPerHold, ratio)
	if !c.SkipReference && !res.Verified {
		return res, errors.New("bench index: index and reference disagree")
	}
	return res, nil
}

// verify compares final block counts and re-runs every query on both.
func verify(ix matcher, rf *ref.Index, ops []op) bool {
	ws := rf.Workers()
	if len(ws) != len(ix.Workers()) {
		return false
	}
	for _, w := range ws {
		if ix.BlockCounts(w) != rf.BlockCounts(w) {
			return false
		}
	}
	var a []index.Match
	var b []ref.Match
	for i := range ops {
		if ops[i].find == nil {
			continue
		}
		a, b = ix.FindMatches(ops[i].find, a[:0]), rf.FindMatches(ops[i].find, b[:0])
		if len(a) != len(b) {
			return false
		}
		for j := range a {
			if ref.Match(a[j]) != b[j] {
				return false
			}
		}
	}
	return true
}
