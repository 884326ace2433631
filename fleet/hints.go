package fleet

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/kvmesh/kvmesh/router"
)

// Reasons a planned hint never reached a worker, the label of
// kvmesh_fleet_kv_hints_dropped_total. With the router's
// kvmesh_router_hints_planned_total and the workers'
// kvmesh_worker_kv_hint_outcomes_total they account for every hint: planned =
// dropped here + the outcomes counted by the workers the rest reached (a
// worker process that dies takes its own counts with it).
const (
	hintDropWorkerLeft  = "worker_left" // discovery dropped the chosen worker between routing and dispatch
	hintDropUnreachable = "unreachable" // no connection, or the stream could not be opened
	hintDropCancelled   = "cancelled"   // the request was cancelled before it was dispatched
)

var hintDropReasons = []string{hintDropWorkerLeft, hintDropUnreachable, hintDropCancelled}

func newHintDrops() *prometheus.CounterVec {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_fleet_kv_hints_dropped_total",
		Help: "Planned KV hints that never reached a worker, by reason: worker_left, unreachable or cancelled.",
	}, []string{"reason"})
	for _, r := range hintDropReasons {
		v.WithLabelValues(r)
	}
	return v
}

// dropHint counts d's hint, if any, as dropped before reaching a worker.
func (c *Cluster) dropHint(d *router.Decision, reason string) {
	if d.Hint != nil {
		c.hintDrops.WithLabelValues(reason).Inc()
	}
}

// hintAckTimeout bounds how long a cancelled hinted stream waits for the
// worker's acknowledgement before it is cancelled anyway (a hung worker).
const hintAckTimeout = 2 * time.Second

// streamContext is the worker stream's context. A hinted stream's is
// detached from the caller's cancellation, which holdCancel then relays.
func streamContext(ctx context.Context, hinted bool) (context.Context, context.CancelFunc) {
	if hinted {
		return context.WithCancel(context.WithoutCancel(ctx))
	}
	return context.WithCancel(ctx)
}

// holdCancel relays the caller's cancellation (and the stream's Close) to a
// hinted stream only once the worker acknowledged it (it sends its response
// headers first thing), so a request cancelled the instant it was sent
// still reaches the worker, which counts its hint. Without that, gRPC may
// drop the request before the worker's handler ever reads it, and the hint
// would end uncounted. A worker that does not acknowledge within
// hintAckTimeout is cancelled anyway. It returns the stream's cancel func.
func holdCancel(ctx context.Context, st grpc.ClientStream, cancel context.CancelFunc) context.CancelFunc {
	var once sync.Once
	release := func() {
		once.Do(func() {
			go func() {
				t := time.AfterFunc(hintAckTimeout, cancel)
				_, _ = st.Header() // returns once the headers arrive or the stream ends
				t.Stop()
				cancel()
			}()
		})
	}
	stop := context.AfterFunc(ctx, release)
	return func() {
		stop()
		release()
	}
}
