package worker

import (
	"context"
	"time"

	"github.com/kvmesh/kvmesh/engine"
)

// watchHealth follows an engine that reports its health (engine.Health):
// while it is unhealthy the worker is out of discovery, so routers stop
// choosing it, and Generate answers Unavailable (open streams end so, see
// server.go), so callers migrate; when it is healthy again the worker
// registers again. Each transition is logged once and counted.
func (w *Worker) watchHealth(ctx context.Context, h engine.Health) {
	for {
		healthy, changed := h.Health()
		if healthy == w.engineDown.Load() {
			w.engineDown.Store(!healthy)
			if !healthy {
				w.met.engineDowns.Inc()
				w.met.healthy.Set(0)
				w.log.Warn("engine unhealthy: worker leaves discovery and fails its streams until the engine is healthy again")
			} else if !w.wd.stalled.Load() {
				w.met.healthy.Set(1)
				w.log.Info("engine healthy again: worker back in discovery")
			}
			// Retried while NATS is away, until the verdict changes again.
			for {
				rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				err := w.setListed(rctx, healthy)
				cancel()
				if err == nil || ctx.Err() != nil {
					break
				}
				w.log.Warn("discovery update after an engine health change failed; retrying", "healthy", healthy, "err", err)
				select {
				case <-ctx.Done():
					return
				case <-changed:
				case <-time.After(time.Second):
				}
				if now, _ := h.Health(); now != healthy {
					break
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// engineHealth is the engine's verdict and the channel closed at its next
// change; always healthy for an engine that does not report it.
func (w *Worker) engineHealth() (bool, <-chan struct{}) {
	if h, ok := w.eng.(engine.Health); ok {
		return h.Health()
	}
	return true, nil
}
