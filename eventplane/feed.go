package eventplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/kv"
)

// Applier is where a Feed puts events: the router's index.
// An Feed calls it from one goroutine only.
type Applier interface {
	Apply(kv.Event)
	RemoveWorker(kv.WorkerKey)
}

// Repairer fetches what a feed missed from the worker itself.
type Repairer interface {
	// Events returns the events of w with from ≤ id ≤ to, all of them in
	// order, or tooOld when the worker no longer has from; only those up
	// to its last id when that is below to (the gap is not its own).
	Events(ctx context.Context, in discovery.Instance, w kv.WorkerKey, from, to uint64) (evs []kv.Event, tooOld bool, err error)
	// Dump returns w's holdings as Stored events and the last event id
	// they reflect.
	Dump(ctx context.Context, in discovery.Instance, w kv.WorkerKey) (evs []kv.Event, last uint64, err error)
}

// FeedConfig configures a Feed.
type FeedConfig struct {
	Model    string
	Applier  Applier
	Repairer Repairer
	// MaxQueue bounds the events held per worker key while a repair is in
	// flight; beyond it the queue is dropped and a full dump follows.
	// Default DefaultMaxQueue.
	MaxQueue int
	// RepairTimeout bounds one repair call; default 10s.
	RepairTimeout time.Duration
	// ChanSize is the subscription buffer (messages); default 8192. A
	// slow feed drops messages, which then show up as gaps and are repaired.
	ChanSize int
	// Local, when set, carries the batches of this process's own workers
	// to the feed in process; their NATS copies are skipped.
	Local  *Local
	Logger *slog.Logger
}

// FeedStats counts what a feed did.
type FeedStats struct {
	Batches, Applied, Duplicates    int64
	Gaps, RangeRepairs, DumpRepairs int64
	// TailGaps are the gaps (also in Gaps) found from a load report's
	// announced last id rather than from a later event.
	TailGaps                         int64
	RepairErrors, QueueOverflows     int64
	BadMessages, UnknownInstance     int64
	InstancesAdded, InstancesRemoved int64
	StaleRepairs                     int64
	// UnfillableGaps are gaps the worker's own ids do not reach (forged
	// or foreign events): repaired by a dump, never retried.
	UnfillableGaps int64
	// LocalCopies are NATS messages on the subject of a worker of this
	// process, whose batches come in process (Local): skipped unread,
	// so neither the worker's own copies nor forgeries apply.
	LocalCopies int64
}

// Feed is the router side of the event plane for one model: the loop that
// drives a FeedCore from NATS and the Repairer. It subscribes to every
// worker's event subject, hands messages, discovery changes, load reports
// and repair answers to the core one at a time, and carries out the
// core's actions: events to the Applier, fetches on their own goroutines.
type Feed struct {
	nc  *nats.Conn
	cfg FeedConfig
	log *slog.Logger

	ops     chan func()
	results chan Answer
	msgs    chan *nats.Msg
	local   chan localBatch

	core   *FeedCore       // loop-owned
	runCtx context.Context // Run's context; repairs stop with it

	mu    sync.Mutex // guards the published copies below
	last  map[kv.WorkerKey]uint64
	stats FeedStats

	wg      sync.WaitGroup
	running atomic.Bool
}

// NewFeed prepares a feed; Run starts it.
func NewFeed(nc *nats.Conn, cfg FeedConfig) (*Feed, error) {
	if cfg.Model == "" || cfg.Applier == nil || cfg.Repairer == nil {
		return nil, errors.New("event feed: model, applier and repairer are required")
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
		ops: make(chan func(), 1024), results: make(chan Answer, 64), msgs: make(chan *nats.Msg, cfg.ChanSize), local: make(chan localBatch, cfg.ChanSize),
		core: NewFeedCore(cfg.MaxQueue), last: map[kv.WorkerKey]uint64{}}, nil
}

// OnDiscovery hands a discovery change to the feed; call it from a
// Watcher's callback. It blocks only if the feed is far behind.
func (f *Feed) OnDiscovery(ev discovery.Event) {
	f.ops <- func() { f.do(f.core.Discovery(ev)) }
}

// OnLoadReport hands the feed the last event ids a load report announces
// (see FeedCore.Load). It never blocks: a dropped announcement is repeated
// by the next report.
func (f *Feed) OnLoadReport(r LoadReport) {
	if len(r.LastEventIDs) == 0 && r.LastEventID == 0 {
		return
	}
	select {
	case f.ops <- func() { f.do(f.core.Load(r)) }:
	default:
	}
}

// offerLocal queues a batch from a worker of this process (Local). It
// never blocks: a batch dropped from a full queue is a gap, repaired as a
// NATS message dropped by a slow feed is.
func (f *Feed) offerLocal(instance uint64, batch []kv.Event) {
	select {
	case f.local <- localBatch{instance: instance, events: batch}:
	default:
	}
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
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stats
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
	if l := f.cfg.Local; l != nil {
		l.attach(f.cfg.Model, f)
		defer l.detach(f.cfg.Model, f)
	}
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
			if f.cfg.Local != nil && f.cfg.Local.owns(m.Subject) {
				f.do(f.core.LocalCopy()) // taken from the in-process plane
				continue
			}
			f.do(f.core.Message(m.Subject, m.Data))
		case b := <-f.local:
			f.do(f.core.Batch(b.instance, b.events))
		case a := <-f.results:
			f.do(f.core.Answer(a))
		}
	}
}

// do carries out the core's actions, then publishes the last ids and
// counters they changed.
func (f *Feed) do(acts []Action) {
	for i := range acts {
		a := &acts[i]
		switch a.Kind {
		case ActApply:
			for _, e := range a.Events {
				f.cfg.Applier.Apply(e)
			}
		case ActRemoveWorker:
			f.cfg.Applier.RemoveWorker(a.Worker)
		case ActFetch:
			f.fetch(a.Fetch)
		case ActBad:
			f.log.Warn("event feed: skipping bad message", "where", a.Where, "err", a.Err)
		}
	}
	f.mu.Lock()
	for i := range acts {
		switch a := &acts[i]; a.Kind {
		case ActApply:
			f.last[a.Worker] = a.Last
		case ActRemoveWorker, ActFetch:
			delete(f.last, a.Worker)
		}
	}
	f.stats = f.core.Stats()
	f.mu.Unlock()
}

// fetch runs one repair on its own goroutine and hands the answer back to
// the loop.
func (f *Feed) fetch(r *Fetch) {
	if r.Retry != nil {
		f.log.Warn("event feed: repair failed; retrying", "worker", r.Worker, "addr", r.Instance.GRPCAddr, "dump", r.Dump, "retry_in", r.Delay, "err", r.Retry)
	} else {
		f.log.Debug("event feed: repairing", "worker", r.Worker, "dump", r.Dump, "from", r.From, "to", r.To)
	}
	ctx := f.runCtx
	f.wg.Go(func() {
		if r.Delay > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(r.Delay):
			}
		}
		a := Answer{Worker: r.Worker, Ticket: r.Ticket}
		cctx, ccancel := context.WithTimeout(ctx, f.cfg.RepairTimeout)
		if r.Dump {
			a.Events, a.Last, a.Err = f.cfg.Repairer.Dump(cctx, r.Instance, r.Worker)
		} else {
			a.Events, a.TooOld, a.Err = f.cfg.Repairer.Events(cctx, r.Instance, r.Worker, r.From, r.To)
		}
		ccancel()
		select {
		case f.results <- a:
		case <-ctx.Done():
		}
	})
}
