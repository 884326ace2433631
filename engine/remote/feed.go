package remote

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/events"
	"github.com/kvmesh/kvmesh/kv"
)

// Feed hands what subscribers deliver to a worker's event sink. They run
// from the first non-nil sink on, so no event is taken before someone
// listens (with a replay endpoint they then catch up on what the publisher
// still buffers), until Close. The KV-event relay and the KVCR state agent
// share it.
type Feed struct {
	subs    []*events.Subscriber
	log     *slog.Logger
	stopped string // logged when a subscriber stops with an error

	sink atomic.Pointer[engine.EventSink]

	mu      sync.Mutex
	started bool
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// NewFeed prepares a feed of subs; stopped is the message logged when one
// of them stops with an error.
func NewFeed(log *slog.Logger, stopped string, subs ...*events.Subscriber) *Feed {
	return &Feed{subs: subs, log: log, stopped: stopped}
}

// SetSink installs where events go (nil drops them); the first non-nil
// sink starts the subscribers.
func (f *Feed) SetSink(s engine.EventSink) {
	if s == nil {
		f.sink.Store(nil)
		return
	}
	f.sink.Store(&s)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.started {
		return
	}
	f.started = true
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	for _, sub := range f.subs {
		f.wg.Go(func() {
			if err := sub.Run(ctx); err != nil {
				f.log.Error(f.stopped, "err", err)
			}
		})
	}
}

// Send hands evs to the sink, if one is installed.
func (f *Feed) Send(evs []kv.Event) {
	if p := f.sink.Load(); p != nil {
		(*p)(evs)
	}
}

// Close stops the subscribers.
func (f *Feed) Close() {
	f.mu.Lock()
	cancel := f.cancel
	f.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	f.wg.Wait()
}
