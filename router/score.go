package router

import (
	"math"
	"slices"

	"github.com/kvmesh/kvmesh/kv"
)

// scorer is the stage that prices the candidates a request's filters
// left: it sets s.cost[j] for worker s.cand[j], lower is better.
type scorer interface {
	score(s *selection)
}

// costScorer prices candidates with the request's cost model (s.cm),
// whose kind picks the overlap (block) cost or the time cost.
type costScorer struct{}

func (costScorer) score(s *selection) {
	s.cost = slices.Grow(s.cost[:0], len(s.cand))[:len(s.cand)]
	if s.cm.Kind == CostTime {
		timeCosts(s)
		return
	}
	isl := float64(s.req.promptLen())
	charge := isl // prompt tokens charged as prefill
	if s.req.NoPrefillCharge {
		charge = 0
	}
	for j, i := range s.cand {
		s.cost[j] = s.cm.cost(s.depth[i], s.p.slots[i].load, s.seq, isl, charge, s.p.blockSize)
	}
}

// timeCosts sets the CostTime price (CostModel.timeCost) of every
// candidate. Each reads its worker's load, one cache miss apiece at
// thousands of workers: touching the load warmAhead candidates on lets
// those misses overlap instead of queueing.
func timeCosts(s *selection) {
	slots, cand := s.p.slots, s.cand
	isl := float64(s.req.promptLen())
	in := costInput{blockSz: s.p.blockSize, noCharge: s.req.NoPrefillCharge}
	var t int64
	for j, i := range cand {
		if k := j + warmAhead; k < len(cand) {
			t += slots[cand[k]].load.prefillTokens
		}
		sl := &slots[i]
		in.depth, in.load, in.timing, in.budget, in.kvCap = s.depth[i], sl.load, sl.timing, sl.budget, sl.kvCap
		in.usage = s.r.reportedUsage(sl.load, s.now)
		in.tierMS, in.backlogMS = TierLoad{}, 0
		if sl.tiers {
			in.tierMS = sl.w.info.TierLoad
			in.backlogMS = sl.load.backlogMS(s.now)
		}
		s.cost[j] = s.cm.timeCost(&in, s.seq, isl)
	}
	s.touched += t
}

// warmAhead is how many candidates ahead timeCosts touches.
const warmAhead = 8

// cost is the DESIGN.md §5 cost of routing a request with isl tokens and
// prompt blocks seq to a worker with cumulative overlap depth and load l;
// charge is how many of the prompt's tokens count as prefill (isl, or 0
// for a decode leg whose KV arrives from elsewhere).
func (m *CostModel) cost(depth [kv.NumTiers]uint32, l *load, seq []kv.SeqHash, isl, charge float64, blockSize int) float64 {
	prefill := max((float64(l.prefillTokens)+charge)/float64(blockSize)-m.credit(depth), 0)
	// Decode blocks: what is active now plus what this request would add
	// (its blocks already active on the worker are shared, not new).
	reqBlocks := math.Ceil(isl / float64(blockSize))
	decode := float64(l.uniqueBlocks()) + reqBlocks - float64(l.activePrefix(seq))
	return m.PrefillScale*prefill + decode
}
