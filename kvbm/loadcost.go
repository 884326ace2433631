package kvbm

import (
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// LoadCost prices onboarding matched blocks against recomputing their
// tokens, so the connector loads only what is cheaper to load.
type LoadCost struct {
	// PerBlock is the time to load one block from each tier onto the
	// device, indexed by kv.Tier (0: free).
	PerBlock [kv.NumTiers]time.Duration
	// RecomputeToken is the engine's prefill cost per token. 0 means
	// unknown: every match is loaded, as without a LoadCost.
	RecomputeToken time.Duration
}

// LoadPrefix returns how many leading blocks of a match to load, block i
// being in tier tiers[i] and blocks bs tokens long. A request that loads
// k blocks waits for the loads already queued (backlog) and then its own
// (the sum of its blocks' PerBlock); one that loads none recomputes them
// (k·bs·RecomputeToken) and waits for nothing. It picks the k that saves
// the most time, k·bs·RecomputeToken − backlog − Σ_{i<k} PerBlock, and 0
// when no k saves any (a tie is not worth a load). Tiers are matched
// host, then disk, then object, so later blocks are usually the dearer
// ones; the scan takes every prefix, whatever the order.
func (c LoadCost) LoadPrefix(tiers []kv.Tier, bs int, backlog time.Duration) int {
	if c.RecomputeToken <= 0 || len(tiers) == 0 {
		return len(tiers)
	}
	per := time.Duration(bs) * c.RecomputeToken
	best, bestSave := 0, time.Duration(0)
	save := -max(backlog, 0)
	for i, t := range tiers {
		load := time.Duration(0)
		if t.Valid() {
			load = c.PerBlock[t]
		}
		save += per - load
		if save > bestSave {
			best, bestSave = i+1, save
		}
	}
	return best
}

// decline unpins matched blocks the connector will not load: they no
// longer count as matched but as declined.
func (m *Manager) decline(staged []Staged) {
	for _, b := range staged {
		switch b.Tier {
		case kv.TierHost:
			m.st.MatchedHost--
		case kv.TierDisk:
			m.st.MatchedDisk--
		default:
			m.st.MatchedObject--
		}
	}
	m.st.DeclinedLoad += uint64(len(staged))
	m.Release(staged)
}
