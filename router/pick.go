package router

import (
	"math"
	"math/rand/v2"
)

// picker is the last stage: it chooses one of the candidates s.cand (the
// filters leave at least one) and returns its index in the pool. It runs
// under the router's lock, which also guards the router's Rand.
type picker interface {
	pick(s *selection) int
}

// roundRobin picks the next candidate at or after the pool's cursor, in
// key order, and moves the cursor past it.
type roundRobin struct{}

func (roundRobin) pick(s *selection) int {
	start := int(s.p.rr % uint64(len(s.p.workers)))
	pick := s.cand[0]
	for _, i := range s.cand {
		if i >= start {
			pick = i
			break
		}
	}
	s.p.rr = uint64(pick + 1)
	return pick
}

// uniformPick draws a candidate uniformly at random.
type uniformPick struct{}

func (uniformPick) pick(s *selection) int {
	return s.cand[s.r.cfg.Rand.IntN(len(s.cand))]
}

// costPick reads the scorer's costs: the cheapest at temperature 0 (or
// when all cost the same), else a softmax draw (CostModel.Temperature).
type costPick struct{}

func (costPick) pick(s *selection) int {
	cmin, cmax := math.Inf(1), math.Inf(-1)
	for _, c := range s.cost {
		cmin, cmax = min(cmin, c), max(cmax, c)
	}
	if s.cm.Temperature == 0 || cmax == cmin {
		// With T > 0 and equal costs the softmax is uniform, which is
		// argmin's draw among ties.
		return argmin(s.cand, s.cost, cmin, s.r.cfg.Rand)
	}
	return softmaxPick(s.cand, s.cost, cmin, cmax, s.cm.Temperature, s.r.cfg.Rand)
}

// argmin picks a candidate whose cost is cmin, uniformly among ties (a
// reservoir draw).
func argmin(cand []int, cost []float64, cmin float64, rng *rand.Rand) int {
	var pick, ties int
	for j, c := range cost {
		if c != cmin {
			continue
		}
		ties++
		if ties == 1 || rng.IntN(ties) == 0 {
			pick = cand[j]
		}
	}
	return pick
}

// softmaxPick draws a candidate with p ∝ exp(−(c−min)/((max−min)·T)): costs
// min–max normalised, so T is independent of the cost's scale. It
// overwrites cost with the weights.
func softmaxPick(cand []int, cost []float64, cmin, cmax, temp float64, rng *rand.Rand) int {
	scale := 1 / ((cmax - cmin) * temp)
	var sum float64
	for j, c := range cost {
		e := math.Exp(-(c - cmin) * scale)
		cost[j] = e
		sum += e
	}
	u := rng.Float64() * sum
	for j, e := range cost {
		u -= e
		if u < 0 {
			return cand[j]
		}
	}
	return cand[len(cand)-1]
}
