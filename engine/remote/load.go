package remote

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	dto "github.com/prometheus/client_model/go"
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

// LoadSeries names a server's load series: requests running and waiting,
// and the fraction of KV blocks in use.
type LoadSeries struct{ Running, Waiting, Usage string }

// ReadRankLoad reads the per-rank load of dpSize ranks of blocks KV
// blocks each from scraped families; rankOf gives a sample's rank (false:
// not this server's, or not the rank that speaks for it).
func ReadRankLoad(fams map[string]*dto.MetricFamily, dpSize, blocks int, series LoadSeries, rankOf func(Sample) (int, bool)) []engine.Stats {
	st := make([]engine.Stats, dpSize)
	each := func(name string, f func(*engine.Stats, float64)) {
		for _, s := range Samples(fams, name) {
			if r, ok := rankOf(s); ok && r >= 0 && r < dpSize {
				f(&st[r], s.Value)
			}
		}
	}
	each(series.Running, func(s *engine.Stats, v float64) { s.Running += int(v) })
	each(series.Waiting, func(s *engine.Stats, v float64) { s.Waiting += int(v) })
	each(series.Usage, func(s *engine.Stats, v float64) {
		s.TotalBlocks, s.UsedBlocks = blocks, int(v*float64(blocks)+0.5)
	})
	return st
}

// ModelRank is a ReadRankLoad rankOf: a sample of another model is not
// this server's; the rank is the label's value (0 when absent).
func ModelRank(model, label string) func(Sample) (int, bool) {
	return func(s Sample) (int, bool) {
		if model != "" && s.Labels["model_name"] != "" && s.Labels["model_name"] != model {
			return 0, false
		}
		r, err := strconv.Atoi(s.Labels[label])
		if err != nil {
			r = 0
		}
		return r, true
	}
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
