// Package enginetest holds test doubles and helpers for engine.Engine, for
// the packages that drive engines (worker, fleet, the adapters' tests):
// a recording engine, prompts, reading a stream to its end, opening an
// engine and serving a stand-in for the test's length. It imports only
// engine and kv; nothing outside tests should use it.
package enginetest

import (
	"context"
	"sync"

	"github.com/kvmesh/kvmesh/engine"
)

// Recorder wraps an engine and keeps a copy of every request it is given,
// to check what reaches an engine. Only the Engine interface is passed
// through: optional interfaces of the wrapped engine (engine.Ranked,
// engine.Inventory) are hidden.
type Recorder struct {
	engine.Engine
	mu   sync.Mutex
	reqs []engine.Request
}

// Generate records req and hands it to the wrapped engine.
func (r *Recorder) Generate(ctx context.Context, req *engine.Request) (<-chan engine.Chunk, error) {
	r.mu.Lock()
	r.reqs = append(r.reqs, *req)
	r.mu.Unlock()
	return r.Engine.Generate(ctx, req)
}

// Take returns the requests recorded since the last Take and forgets them.
func (r *Recorder) Take() []engine.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.reqs
	r.reqs = nil
	return out
}

// Run generates req on e to the end of its stream and returns the first
// chunk error, if any.
func Run(ctx context.Context, e engine.Engine, req *engine.Request) error {
	ch, err := e.Generate(ctx, req)
	if err != nil {
		return err
	}
	for c := range ch {
		if c.Err != nil {
			return c.Err
		}
	}
	return nil
}
