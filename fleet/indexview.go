package fleet

import (
	"slices"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
)

// IndexView is the router's view of what every worker key holds, as the
// frontend's /debug/kv-index serves it: what an operator (or the chaos
// suite) compares with each worker's own inventory (its gRPC Dump).
type IndexView struct {
	Workers []WorkerHoldings `json:"workers"`
}

// WorkerHoldings is one worker key's blocks per tier ("device", "host",
// ...), by the engine's own hashes, ascending.
type WorkerHoldings struct {
	Instance string                     `json:"instance"` // hex, as in subjects and logs
	DPRank   uint32                     `json:"dp_rank"`
	Blocks   map[string][]kv.EngineHash `json:"blocks"`
}

// IndexView lists the holdings of every worker key the index knows,
// including keys discovery no longer lists (stale holdings are exactly
// what a reader of this view looks for). It dumps the whole index: a debug
// surface, not a hot path.
func (c *Cluster) IndexView() any { return indexView(c.index) }

func indexView(ix *index.Index) IndexView {
	v := IndexView{Workers: []WorkerHoldings{}}
	for _, w := range ix.Workers() {
		v.Workers = append(v.Workers, WorkerHoldings{Instance: natsbus.InstanceToken(w.Instance), DPRank: w.DPRank, Blocks: HeldBlocks(ix.Dump(w))})
	}
	return v
}

// HeldBlocks folds Stored/Removed/Cleared events (a dump, or a dump and
// what followed it) into the blocks held per tier, ascending; tiers that
// hold nothing are left out.
func HeldBlocks(evs []kv.Event) map[string][]kv.EngineHash {
	var held [kv.NumTiers]map[kv.EngineHash]struct{}
	for _, e := range evs {
		if int(e.Tier) >= kv.NumTiers {
			continue
		}
		switch e.Kind {
		case kv.EventStored:
			if held[e.Tier] == nil {
				held[e.Tier] = map[kv.EngineHash]struct{}{}
			}
			for _, b := range e.Blocks {
				held[e.Tier][b.EngineHash] = struct{}{}
			}
		case kv.EventRemoved:
			for _, h := range e.Removed {
				delete(held[e.Tier], h)
			}
		case kv.EventCleared:
			held = [kv.NumTiers]map[kv.EngineHash]struct{}{}
		}
	}
	out := map[string][]kv.EngineHash{}
	for t, m := range held {
		if len(m) == 0 {
			continue
		}
		hs := make([]kv.EngineHash, 0, len(m))
		for h := range m {
			hs = append(hs, h)
		}
		slices.Sort(hs)
		out[kv.Tier(t).String()] = hs
	}
	return out
}
