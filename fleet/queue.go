package fleet

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
)

// liveQueue is the router queue of a live cluster (Config.Queue): a
// request's leg (whole, or with P/D its prefill or decode leg) no worker
// admits (router.AdmitConfig) waits here, and a
// dispatcher offers the waiting ones to the router, in the queue's order,
// whenever something may have freed capacity — a request arrived, or the
// poll interval passed while any wait. Waiting requests are bound to no
// worker, so one that dies takes none of them along: the next dispatch
// routes them among the workers left.
//
// A request every worker refused (a plain busy answer, round-robin's) is
// routed again only once the router's worker state changed since
// (router.Changes: a booking, a first token, an end, a load report, a
// worker joining or leaving), or reask passed: routing hashes and matches
// its prompt, and while nothing changed Route would refuse it the same way.
// reask bounds what time alone changes (a report ageing out, an
// inhibition lapsing) and any signal missed.
type liveQueue struct {
	r    *router.Router
	poll time.Duration
	kick chan struct{}

	mu     sync.Mutex
	q      *router.Queue[*waiter]
	reask  time.Duration // a refused request is routed again at least this often
	routes int           // Route calls for waiting requests (tests)

	wait  *prometheus.HistogramVec
	depth prometheus.Gauge
}

// waiter is one queued request; the dispatcher answers on done (buffered,
// so it never blocks on a waiter that left).
type waiter struct {
	ctx  context.Context
	req  router.Request
	done chan queueAnswer
	// refused: every worker refused req at refusedAt, with the router's
	// change count at chg.
	refused   bool
	chg       uint64
	refusedAt time.Time
}

type queueAnswer struct {
	d   *router.Decision
	err error
}

// queuePoll is how often the dispatcher retries while requests wait: the
// router hears of freed capacity (first tokens, ends, load reports) from
// many places, and a poll this short adds less than an engine pass.
const queuePoll = 5 * time.Millisecond

// queueReask is liveQueue.reask: short next to a load report's TTL and an
// inhibition, long next to the poll.
const queueReask = 250 * time.Millisecond

func newLiveQueue(r *router.Router, cfg router.QueueConfig) (*liveQueue, error) {
	q, err := router.NewQueue[*waiter](cfg)
	if err != nil {
		return nil, err
	}
	return &liveQueue{r: r, q: q, poll: queuePoll, reask: queueReask, kick: make(chan struct{}, 1),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvmesh_router_queue_seconds",
			Help:    "Time requests waited in the router queue for a worker to admit them (part of their TTFT).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18)}, []string{"model"}),
		depth: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvmesh_router_queue_depth",
			Help: "Requests waiting in the router queue now."}),
	}, nil
}

func (lq *liveQueue) collectors() []prometheus.Collector {
	return []prometheus.Collector{lq.wait, lq.depth}
}

// await holds req (which Route just answered busy for) until a worker
// admits it and returns its decision, or fails: a *kv.QueueFullError past
// the limit, ctx's error when the client leaves (its slot is free at
// once), a routing error other than busy.
func (lq *liveQueue) await(ctx context.Context, req router.Request) (*router.Decision, error) {
	w := &waiter{ctx: ctx, req: req, done: make(chan queueAnswer, 1)}
	lq.mu.Lock()
	start := time.Now() // under the lock: the queue's age bound wants arrival order
	e, err := lq.q.Push(w, start, float64(len(req.Tokens)), 0)
	if err == nil {
		lq.depth.Set(float64(lq.q.Len()))
	}
	lq.mu.Unlock()
	if err != nil {
		return nil, &kv.QueueFullError{Model: req.Model, Limit: lq.q.Config().Limit, RetryAfter: time.Second}
	}
	lq.poke()
	select {
	case res := <-w.done:
		lq.wait.WithLabelValues(req.Model).Observe(time.Since(start).Seconds())
		return res.d, res.err
	case <-ctx.Done():
		lq.mu.Lock()
		left := lq.q.Remove(e)
		lq.depth.Set(float64(lq.q.Len()))
		lq.mu.Unlock()
		if !left {
			// The dispatcher took it meanwhile: give back what it booked.
			if res := <-w.done; res.d != nil {
				res.d.Done()
			}
		}
		return nil, ctx.Err()
	}
}

func (lq *liveQueue) poke() {
	select {
	case lq.kick <- struct{}{}:
	default:
	}
}

// run dispatches until ctx ends.
func (lq *liveQueue) run(ctx context.Context) {
	t := time.NewTicker(lq.poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-lq.kick:
		case <-t.C:
		}
		lq.dispatch()
	}
}

// dispatch offers the waiting requests to the router in the queue's order.
func (lq *liveQueue) dispatch() {
	lq.mu.Lock()
	defer lq.mu.Unlock()
	if lq.q.Len() == 0 {
		return
	}
	now := time.Now()
	chg := lq.r.Changes() // before routing: a change meanwhile reads as new
	lq.q.Scan(now, lq.q.Config().Lookahead, func(e *router.Queued[*waiter]) (bool, bool) {
		w := e.Value
		if !w.req.Aged && lq.q.Aged(e, now) {
			w.req.Aged, w.refused = true, false // it now takes any worker that admits it
		}
		if w.refused && w.chg == chg && now.Sub(w.refusedAt) < lq.reask {
			return false, false
		}
		lq.routes++
		d, err := lq.r.Route(w.ctx, w.req)
		if err != nil && errors.Is(err, kv.ErrAllBusy) {
			// A cost mode's WaitError is no refusal by all: routed each poll, as before.
			var we *router.WaitError
			w.refused, w.chg, w.refusedAt = !errors.As(err, &we), chg, now
			return false, false
		}
		w.done <- queueAnswer{d, err}
		return true, false
	})
	lq.depth.Set(float64(lq.q.Len()))
}
