package worker

import (
	"encoding/json"
	"errors"
	"net/http"
)

// Live reports whether the worker should keep running: an error once the
// watchdog declared its engine stalled (it never serves again, so whatever
// supervises the process should restart it) or after Close.
func (w *Worker) Live() error {
	w.mu.Lock()
	closed := w.closed
	w.mu.Unlock()
	switch {
	case closed:
		return errors.New("worker closed")
	case w.wd.stalled.Load():
		return errors.New("engine stalled: the worker left discovery and serves no more requests; restart it")
	}
	return nil
}

// Ready reports whether routers can send the worker requests: started,
// live, and (with a NATS connection) its discovery record current.
func (w *Worker) Ready() error {
	if err := w.Live(); err != nil {
		return err
	}
	w.mu.Lock()
	started, reg := w.started, w.reg
	w.mu.Unlock()
	switch {
	case !started:
		return errors.New("worker not started")
	case w.engineDown.Load():
		return errors.New("engine unhealthy: the worker is out of discovery until its engine answers /health again")
	case w.nc != nil && reg == nil:
		return errors.New("worker not registered in discovery")
	case reg != nil:
		return reg.Current()
	}
	return nil
}

// HealthHandler serves GET /live (Live) and GET /health (Ready) for
// Kubernetes probes: 200 {"status":"live"|"ready"}, or 503 with the
// reason.
func (w *Worker) HealthHandler() http.Handler {
	mux := http.NewServeMux()
	probe := func(ok string, check func() error) http.HandlerFunc {
		return func(rw http.ResponseWriter, _ *http.Request) {
			rw.Header().Set("Content-Type", "application/json")
			body := map[string]string{"status": ok}
			if err := check(); err != nil {
				body = map[string]string{"status": "unavailable", "reason": err.Error()}
				rw.WriteHeader(http.StatusServiceUnavailable)
			}
			_ = json.NewEncoder(rw).Encode(body)
		}
	}
	mux.HandleFunc("GET /live", probe("live", w.Live))
	mux.HandleFunc("GET /health", probe("ready", w.Ready))
	return mux
}
