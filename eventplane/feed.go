package eventplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/natsbus"
)

// Applier is where an Feed puts events: the router's index.
// An Feed calls it from one goroutine only.
type Applier interface {
	Apply(kv.Event)
	RemoveWorker(kv.WorkerKey)
}

// Repairer fetches what a feed missed from the worker itself.
type Repairer interface {
	// Events returns the events of w with from ≤ id ≤ to, all of them in
	// order, or tooOld when the worker no longer has from.
	Events(ctx context.Context, in discovery.Instance, w kv.WorkerKey, from, to uint64) (evs []kv.Event, tooOld bool, err error)
	// Dump returns w's holdings as Stored events and the last event id
	// they reflect.
	Dump(ctx context.Context, in discovery.Instance, w kv.WorkerKey) (evs []kv.Event, last uint64, err error)
}

// FeedConfig configures an Feed.
type FeedConfig struct {
	Model    string
	Applier  Applier
	Repairer Repairer
	// MaxQueue bounds the events held per worker key while a repair is in
	// flight; beyond it the queue is dropped and a full dump follows.
	// Default 65536.
	MaxQueue int
	// RepairTimeout bounds one repair call; default 10s.
	RepairTimeout time.Duration
	// ChanSize is the subscription buffer (messages); default 8192. A
	// slow feed drops messages, which then show up as gaps and are repaired.
	ChanSize int
	Logger   *slog.Logger
}

// FeedStats counts what a feed did.
type FeedStats struct {
	Batches, Applied, Duplicates    int64
	Gaps, RangeRepairs, DumpRepairs int64
	// TailGaps are the gaps (also in Gaps) found from a load report's
	// announced last id rather than from a later event.
	TailGaps                          int64
	RepairErrors, QueueOverflows      int64
	BadMessages, UnknownInstance      int64
	InstancesAdded, InstancesRemoved  int64
	DroppedAfterRemoval, StaleRepairs int64
}

// Feed is the router side of the event plane for one model. It
// subscribes to every worker's event subject, applies events per worker key
// in id order, detects gaps (id > last+1) and repairs them over the worker
// API: the missing range, or a full dump when the range is too old. A newly
// discovered instance is dumped; a removed one is dropped from the applier
// at once. Events that arrive while a key is being repaired are queued and
// applied in order afterwards.
type Feed struct {
	nc  *nats.Conn
	cfg FeedConfig
	log *slog.Logger

	ops     chan func()
	results chan repairResult
	msgs    chan *nats.Msg

	// loop-owned state
	insts  map[uint64]*feedInstance
	gen    uint64
	runCtx context.Context // Run's context; repairs stop with it

	mu   sync.Mutex
	last map[kv.WorkerKey]uint64 // published copy for LastID

	st      feedCounters
	wg      sync.WaitGroup
	running atomic.Bool
}

type feedCounters struct {
	batches, applied, duplicates, gaps, rangeRepairs, dumpRepairs, repairErrors,
	queueOverflows, badMessages, unknownInstance, added, removed, droppedAfterRemoval, staleRepairs, tailGaps atomic.Int64
}

type feedInstance struct {
	info discovery.Instance
	gen  uint64
	keys []*feedKey
}

type feedKey struct {
	w         kv.WorkerKey
	last      uint64
	repairing bool
	needDump  bool
	queue     []kv.Event
	backoff   time.Duration
	// announced is the highest last id the worker's load reports named.
	announced uint64
}

type repairResult struct {
	gen    uint64
	w      kv.WorkerKey
	dump   bool
	evs    []kv.Event
	last   uint64
	tooOld bool
	err    error
}

// NewFeed prepares a feed; Run starts it.
func NewFeed(nc *nats.Conn, cfg FeedConfig) (*Feed, error) {
	if cfg.Model == "" || cfg.Applier == nil || cfg.Repairer == nil {
		return nil, errors.New("event feed: model, applier and repairer are required")
	}
	if cfg.MaxQueue <= 0 {
		cfg.MaxQueue = 65536
	}
	if cfg.RepairTimeout <= 0 {
		cfg.RepairTimeout = 10 * time.Second
	}
	if cfg.ChanSize <= 0 {
		cfg.ChanSize = 8192
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Feed{nc: nc, cfg: cfg, log: cfg.Logger,
		ops: make(chan func(), 1024), results: make(chan repairResult, 64), msgs: make(chan *nats.Msg, cfg.ChanSize),
		insts: map[uint64]*feedInstance{}, last: map[kv.WorkerKey]uint64{}}, nil
}

// OnDiscovery hands a discovery change to the feed; call it from a
// Watcher's callback. It blocks only if the feed is far behind.
func (f *Feed) OnDiscovery(ev discovery.Event) {
	f.ops <- func() { f.discovery(ev) }
}

// OnLoad hands the feed the last event id a worker announced in its load
// report. Events lost at the end of a stream (a NATS outage, a slow
// consumer) leave no gap until the worker's next event, which may never
// come; the announcement reveals them. The feed repairs when it is still
// behind an id announced one report earlier (the events of the newest
// report may be in flight on the other subscription). It never blocks: a
// dropped announcement is repeated by the next report.
func (f *Feed) OnLoad(w kv.WorkerKey, lastID uint64) {
	if lastID == 0 {
		return
	}
	select {
	case f.ops <- func() { f.announce(w, lastID) }:
	default:
	}
}

// OnLoadReport is OnLoad for every DP rank the report announces (see
// LoadReport.LastEvents): a worker with several ranks sends one report
// with the last event id of each, and a lost tail on any rank is repaired.
func (f *Feed) OnLoadReport(r LoadReport) {
	if len(r.LastEventIDs) == 0 && r.LastEventID == 0 {
		return
	}
	select {
	case f.ops <- func() {
		for w, id := range r.LastEvents() {
			f.announce(w, id)
		}
	}:
	default:
	}
}

func (f *Feed) announce(w kv.WorkerKey, id uint64) {
	fi := f.insts[w.Instance]
	if fi == nil || int(w.DPRank) >= len(fi.keys) {
		return
	}
	k := fi.keys[w.DPRank]
	prev := k.announced
	k.announced = max(k.announced, id)
	if k.repairing || k.last >= prev {
		return
	}
	f.st.gaps.Add(1)
	f.st.tailGaps.Add(1)
	f.log.Debug("event gap at the tail", "worker", k.w, "last", k.last, "announced", k.announced)
	f.startRepair(fi, k)
}

// LastID is the last event id applied for w, and whether w is known and
// not being repaired.
func (f *Feed) LastID(w kv.WorkerKey) (uint64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id, ok := f.last[w]
	return id, ok
}

// Stats returns the counters.
func (f *Feed) Stats() FeedStats {
	s := &f.st
	return FeedStats{Batches: s.batches.Load(), Applied: s.applied.Load(), Duplicates: s.duplicates.Load(),
		Gaps: s.gaps.Load(), RangeRepairs: s.rangeRepairs.Load(), DumpRepairs: s.dumpRepairs.Load(),
		RepairErrors: s.repairErrors.Load(), QueueOverflows: s.queueOverflows.Load(),
		BadMessages: s.badMessages.Load(), UnknownInstance: s.unknownInstance.Load(),
		InstancesAdded: s.added.Load(), InstancesRemoved: s.removed.Load(),
		DroppedAfterRemoval: s.droppedAfterRemoval.Load(), StaleRepairs: s.staleRepairs.Load(), TailGaps: s.tailGaps.Load()}
}

// Run subscribes and processes until ctx ends; it returns after every
// repair goroutine has stopped.
func (f *Feed) Run(ctx context.Context) error {
	if !f.running.CompareAndSwap(false, true) {
		return errors.New("event feed: already running")
	}
	sub, err := f.nc.ChanSubscribe(EventSubjectAll(f.cfg.Model), f.msgs)
	if err != nil {
		return fmt.Errorf("event feed: subscribe: %w", err)
	}
	_ = sub.SetPendingLimits(-1, -1) // the channel is the bound
	ctx, cancel := context.WithCancel(ctx)
	f.runCtx = ctx
	defer func() {
		_ = sub.Unsubscribe()
		cancel()
		f.wg.Wait()
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case op := <-f.ops:
			op()
		case m := <-f.msgs:
			f.message(ctx, m)
		case r := <-f.results:
			f.repaired(ctx, r)
		}
	}
}

func (f *Feed) discovery(ev discovery.Event) {
	in := ev.Instance
	cur := f.insts[in.ID]
	switch ev.Kind {
	case discovery.InstanceAdded, discovery.InstanceUpdated:
		if cur != nil && cur.info.DPSize == in.DPSize {
			cur.info = in // address or metadata change: same holdings
			return
		}
		if cur != nil {
			f.drop(cur)
		}
		f.gen++
		fi := &feedInstance{info: in, gen: f.gen}
		for _, w := range in.Workers() {
			k := &feedKey{w: w, needDump: true}
			fi.keys = append(fi.keys, k)
		}
		f.insts[in.ID] = fi
		f.st.added.Add(1)
		for _, k := range fi.keys {
			f.startRepair(fi, k)
		}
	case discovery.InstanceRemoved:
		if cur != nil {
			f.drop(cur)
			f.st.removed.Add(1)
		}
	}
}

func (f *Feed) drop(fi *feedInstance) {
	delete(f.insts, fi.info.ID)
	f.mu.Lock()
	for _, k := range fi.keys {
		delete(f.last, k.w)
	}
	f.mu.Unlock()
	for _, k := range fi.keys {
		f.cfg.Applier.RemoveWorker(k.w)
	}
}

func (f *Feed) message(ctx context.Context, m *nats.Msg) {
	id, err := natsbus.ParseInstanceToken(m.Subject)
	if err != nil {
		f.bad("subject", err)
		return
	}
	fi := f.insts[id]
	if fi == nil {
		// Not discovered yet (its dump will cover this) or already gone.
		f.st.unknownInstance.Add(1)
		return
	}
	var batch api.KvEventBatch
	if err := proto.Unmarshal(m.Data, &batch); err != nil {
		f.bad(m.Subject, err)
		return
	}
	if batch.Instance != id {
		f.bad(m.Subject, fmt.Errorf("batch of instance %x on its subject", batch.Instance))
		return
	}
	f.st.batches.Add(1)
	for _, p := range batch.Events {
		e, err := api.EventFromProto(p)
		if err == nil && (e.Worker.Instance != id || int(e.Worker.DPRank) >= len(fi.keys)) {
			err = fmt.Errorf("event for worker %v from instance %x (dp_size %d)", e.Worker, id, len(fi.keys))
		}
		if err == nil && e.ID == 0 {
			err = errors.New("event without id")
		}
		if err != nil {
			f.bad(m.Subject, err)
			continue
		}
		f.offer(ctx, fi, fi.keys[e.Worker.DPRank], e)
	}
}

func (f *Feed) bad(where string, err error) {
	f.st.badMessages.Add(1)
	f.log.Warn("event feed: skipping bad message", "where", where, "err", err)
}

// offer takes one event for k: queued while repairing, applied if next,
// skipped if old, and a gap starts a range repair.
func (f *Feed) offer(ctx context.Context, fi *feedInstance, k *feedKey, e kv.Event) {
	if k.repairing {
		if len(k.queue) >= f.cfg.MaxQueue {
			f.st.queueOverflows.Add(1)
			k.queue = k.queue[:0]
			k.needDump = true
		}
		k.queue = append(k.queue, e)
		return
	}
	switch {
	case e.ID <= k.last:
		f.st.duplicates.Add(1)
	case e.ID == k.last+1:
		f.apply(k, e)
	default:
		f.st.gaps.Add(1)
		f.log.Debug("event gap", "worker", k.w, "last", k.last, "got", e.ID)
		k.queue = append(k.queue, e)
		f.startRepair(fi, k)
	}
}

func (f *Feed) apply(k *feedKey, e kv.Event) {
	f.cfg.Applier.Apply(e)
	f.st.applied.Add(1)
	k.last = e.ID
	f.mu.Lock()
	f.last[k.w] = k.last
	f.mu.Unlock()
}

func (f *Feed) startRepair(fi *feedInstance, k *feedKey) {
	k.repairing = true
	f.mu.Lock()
	delete(f.last, k.w)
	f.mu.Unlock()
	r := repairResult{gen: fi.gen, w: k.w, dump: k.needDump}
	in := fi.info
	var from, to uint64
	if !r.dump {
		from, to = k.last+1, k.announced
		if len(k.queue) > 0 {
			to = k.queue[0].ID - 1
		}
	}
	delay := k.backoff
	ctx := f.runCtx
	f.wg.Go(func() {
		if delay > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
		}
		cctx, ccancel := context.WithTimeout(ctx, f.cfg.RepairTimeout)
		if r.dump {
			r.evs, r.last, r.err = f.cfg.Repairer.Dump(cctx, in, k.w)
		} else {
			r.evs, r.tooOld, r.err = f.cfg.Repairer.Events(cctx, in, k.w, from, to)
			r.last = to
		}
		ccancel()
		select {
		case f.results <- r:
		case <-ctx.Done():
		}
	})
}

func (f *Feed) repaired(ctx context.Context, r repairResult) {
	fi := f.insts[r.w.Instance]
	if fi == nil || fi.gen != r.gen {
		f.st.staleRepairs.Add(1)
		return
	}
	k := fi.keys[r.w.DPRank]
	if r.err == nil && !r.dump && !r.tooOld && !contiguous(r.evs, k.last+1, r.last) {
		r.err = fmt.Errorf("range answer [%d,%d] not contiguous (%d events)", k.last+1, r.last, len(r.evs))
	}
	switch {
	case r.err != nil:
		f.st.repairErrors.Add(1)
		k.backoff = min(max(2*k.backoff, 100*time.Millisecond), 5*time.Second)
		f.log.Warn("event feed: repair failed; retrying", "worker", r.w, "addr", fi.info.GRPCAddr, "dump", r.dump, "retry_in", k.backoff, "err", r.err)
		f.restart(fi, k)
		return
	case r.tooOld:
		k.needDump = true
		f.restart(fi, k)
		return
	}
	k.backoff = 0
	if !r.dump && k.needDump {
		// The queue overflowed while the range was in flight.
		f.startRepair(fi, k)
		return
	}
	if r.dump {
		f.st.dumpRepairs.Add(1)
		f.cfg.Applier.RemoveWorker(k.w)
		for _, e := range r.evs {
			e.Worker = k.w
			f.cfg.Applier.Apply(e)
		}
		k.last, k.needDump = r.last, false
	} else {
		f.st.rangeRepairs.Add(1)
		for _, e := range r.evs {
			e.Worker = k.w
			f.cfg.Applier.Apply(e)
			f.st.applied.Add(1)
		}
		k.last = r.last
	}
	k.repairing = false
	f.mu.Lock()
	f.last[k.w] = k.last
	f.mu.Unlock()
	q := k.queue
	k.queue = nil
	for i, e := range q {
		f.offer(ctx, fi, k, e)
		if k.repairing {
			// A new gap: the rest waits behind it.
			k.queue = append(k.queue, q[i+1:]...)
			return
		}
	}
}

// restart retries a repair; a key whose queue overflowed needs a dump.
func (f *Feed) restart(fi *feedInstance, k *feedKey) {
	if !k.needDump && len(k.queue) == 0 {
		k.needDump = true
	}
	f.startRepair(fi, k)
}

func contiguous(evs []kv.Event, from, to uint64) bool {
	if uint64(len(evs)) != to-from+1 {
		return false
	}
	for i, e := range evs {
		if e.ID != from+uint64(i) {
			return false
		}
	}
	return true
}
