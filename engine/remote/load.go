package remote

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/engine"
)

// RankLoad is the per-rank load an adapter last read from its server; safe
// for concurrent use.
type RankLoad struct {
	p atomic.Pointer[[]engine.Stats]
}

// Store replaces the load with st, one entry a rank.
func (l *RankLoad) Store(st []engine.Stats) { l.p.Store(&st) }

// Rank is rank's load; before it was read, only the capacity (blocks).
func (l *RankLoad) Rank(rank, blocks int) engine.Stats {
	if p := l.p.Load(); p != nil && rank < len(*p) {
		return (*p)[rank]
	}
	return engine.Stats{TotalBlocks: blocks}
}

// Sum is the ranks' load summed (zero before the first read).
func (l *RankLoad) Sum() engine.Stats {
	var out engine.Stats
	if p := l.p.Load(); p != nil {
		for _, s := range *p {
			out.Running += s.Running
			out.Waiting += s.Waiting
			out.UsedBlocks += s.UsedBlocks
			out.TotalBlocks += s.TotalBlocks
		}
	}
	return out
}

// Every calls f every d, on wg, until ctx ends: an adapter's reading of
// its server's load.
func Every(ctx context.Context, wg *sync.WaitGroup, d time.Duration, f func(context.Context)) {
	wg.Go(func() {
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				f(ctx)
			}
		}
	})
}
