package mockengine

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/sim"
)

// The Prometheus stand-ins (vLLM, SGLang) report the same per-rank
// figures of the sim under their own metric names: each names its series
// in a table (rankTable), and collectRanks reads every rank at scrape
// time.

// rankView is one DP rank at scrape time.
type rankView struct {
	stats     engine.Stats
	counters  sim.Counters // the rank's own (rankCounters)
	blockSize int
}

// figure is one per-rank quantity and the kind of series it makes.
type figure struct {
	kind prometheus.ValueType
	read func(rankView) float64
}

func gauge(read func(rankView) float64) figure { return figure{prometheus.GaugeValue, read} }

func counter(read func(sim.Counters) uint64) figure {
	return figure{prometheus.CounterValue, func(r rankView) float64 { return float64(read(r.counters)) }}
}

var (
	figRunning = gauge(func(r rankView) float64 { return float64(r.stats.Running) })
	figWaiting = gauge(func(r rankView) float64 { return float64(r.stats.Waiting) })
	// figKVUsage is the used fraction of the rank's KV blocks.
	figKVUsage = gauge(func(r rankView) float64 {
		if r.stats.TotalBlocks == 0 {
			return 0
		}
		return float64(r.stats.UsedBlocks) / float64(r.stats.TotalBlocks)
	})
	figUsedTokens = gauge(func(r rankView) float64 { return float64(r.stats.UsedBlocks * r.blockSize) })
	// figHitRate is the cached fraction of all prompt tokens so far.
	figHitRate = gauge(func(r rankView) float64 {
		if r.counters.PromptTokens == 0 {
			return 0
		}
		return float64(r.counters.CachedTokens) / float64(r.counters.PromptTokens)
	})
	figPromptTokens = counter(func(c sim.Counters) uint64 { return c.PromptTokens })
	figCachedTokens = counter(func(c sim.Counters) uint64 { return c.CachedTokens })
	figOutputTokens = counter(func(c sim.Counters) uint64 { return c.OutputTokens })
	figPreemptions  = counter(func(c sim.Counters) uint64 { return c.Preemptions })
)

// seriesDef names a figure in one engine's exposition.
type seriesDef struct {
	name, help string
	fig        figure
}

type rankSeries struct {
	desc *prometheus.Desc
	fig  figure
}

// rankTable describes each series with the engine's per-rank labels.
func rankTable(labels []string, defs []seriesDef) []rankSeries {
	out := make([]rankSeries, len(defs))
	for i, d := range defs {
		out[i] = rankSeries{desc: prometheus.NewDesc(d.name, d.help, labels, nil), fig: d.fig}
	}
	return out
}

// collectRanks sends every series of table for every DP rank, labelled
// by labels(r).
func (c *core) collectRanks(ch chan<- prometheus.Metric, table []rankSeries, labels func(rank int) []string) {
	counters := c.rankCounters()
	for r := range c.eng.DPSize() {
		view := rankView{stats: c.eng.RankStats(r), counters: counters[r], blockSize: c.sc.BlockSize}
		lv := labels(r)
		for _, s := range table {
			ch <- prometheus.MustNewConstMetric(s.desc, s.fig.kind, s.fig.read(view), lv...)
		}
	}
}

// rankCounters splits the sim's counters by rank: the front engine sums
// every rank, so rank 0's own are the total less the others'.
func (c *core) rankCounters() []sim.Counters {
	n := c.eng.DPSize()
	out := make([]sim.Counters, n)
	out[0] = c.eng.Counters()
	for r := 1; r < n; r++ {
		out[r] = c.eng.Rank(r).Counters()
		o := &out[0]
		o.PromptTokens -= out[r].PromptTokens
		o.CachedTokens -= out[r].CachedTokens
		o.PrefillTokens -= out[r].PrefillTokens
		o.OutputTokens -= out[r].OutputTokens
		o.Preemptions -= out[r].Preemptions
	}
	return out
}
