package router

import (
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// Inhibit keeps a worker key out of selection, and out of hint sources,
// until Config.InhibitFor from now: a worker that just failed a request is
// likely dead, and discovery only drops it once its record lapses. Calling
// it again extends the deadline; the key need not be registered.
func (r *Router) Inhibit(key kv.WorkerKey) {
	now := r.cfg.Now()
	r.mu.Lock()
	r.inhibited[key] = now.Add(r.cfg.InhibitFor)
	r.chg.Add(1)
	r.mu.Unlock()
}

// exclusions is a request's exclusion list plus the keys inhibited at now;
// it drops lapsed inhibitions. Called with r.mu held. It returns exclude
// itself when nothing is inhibited, and never writes into it.
func (r *Router) exclusions(exclude []kv.WorkerKey, now time.Time) []kv.WorkerKey {
	if len(r.inhibited) == 0 {
		return exclude
	}
	out := exclude[:len(exclude):len(exclude)] // an append copies
	for k, until := range r.inhibited {
		if !now.Before(until) {
			delete(r.inhibited, k)
			continue
		}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}
