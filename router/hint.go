package router

import (
	"log/slog"
	"slices"

	"github.com/kvmesh/kvmesh/kv"
)

// HintPlan is the router's KV-hint advice for one decision: fetch the
// blocks named by SeqHashes (root-aligned: the first len(SeqHashes) blocks
// of the prompt, in the engine's hash domain — the sequence hash for the
// sim) from Source's control endpoint before prefilling. Building the wire
// envelope is the hints package's job.
type HintPlan struct {
	Source    kv.WorkerKey
	Endpoint  string
	SeqHashes []uint64
	// TargetBlocks is the prefix the target already holds (any tier).
	TargetBlocks int
}

// PlanHint picks, for a request routed to target, the eligible source with
// the longest prefix strictly longer than the target's (kvcr_hints.md
// §3.1): the target must be hint-capable; a source is another worker key of
// the same role and compatibility digest with a control endpoint. Ties go
// to the lowest key. workers and matches are in ascending key order as the
// index returns them; seq is the request's sequence hashes.
func PlanHint(target WorkerInfo, workers []WorkerInfo, matches []Match, seq []kv.SeqHash) (HintPlan, bool) {
	var targetDepth uint32
	for _, m := range matches {
		if m.Worker == target.Key {
			targetDepth = m.Depth[kv.NumTiers-1]
		}
	}
	best, bestDepth := -1, targetDepth
	mi := 0
	for i := range workers {
		w := &workers[i]
		for mi < len(matches) && cmpKey(matches[mi].Worker, w.Key) < 0 {
			mi++
		}
		if mi == len(matches) || matches[mi].Worker != w.Key {
			continue
		}
		if d := matches[mi].Depth[kv.NumTiers-1]; d > bestDepth && eligibleSource(target, w) {
			best, bestDepth = i, d
		}
	}
	if best < 0 || !target.HintCapable {
		return HintPlan{}, false
	}
	return makePlan(workers[best], targetDepth, bestDepth, seq)
}

func eligibleSource(target WorkerInfo, s *WorkerInfo) bool {
	return s.Key != target.Key && s.Role.Norm() == target.Role.Norm() &&
		s.Model == target.Model && s.Digest == target.Digest && s.ControlEndpoint != ""
}

func makePlan(src WorkerInfo, targetDepth, srcDepth uint32, seq []kv.SeqHash) (HintPlan, bool) {
	n := min(int(srcDepth), len(seq))
	if n <= int(targetDepth) {
		return HintPlan{}, false
	}
	return HintPlan{Source: src.Key, Endpoint: src.ControlEndpoint, SeqHashes: kv.RawHashes(seq[:n:n]), TargetBlocks: int(targetDepth)}, true
}

// HintCandidate is an eligible hint source for one decision.
type HintCandidate struct {
	Worker WorkerInfo
	// Blocks is the source's matched prefix (any tier: a peer's host-tier
	// blocks count), strictly longer than the target's.
	Blocks int
}

// HintPolicy chooses the source of a decision's hint among candidates, the
// eligible sources sorted longest prefix first (ties: lowest key), given the
// target and the prefix it already holds. It returns an index into
// candidates (0 is the default choice) or HintSkip to attach no hint; any
// other value attaches none and is logged. It runs under the router's lock:
// it must be quick and must not call back into the router.
type HintPolicy func(target WorkerInfo, targetBlocks int, candidates []HintCandidate) int

// HintSkip is the HintPolicy answer that attaches no hint.
const HintSkip = -1

// planHint is PlanHint over a pool, with the depths Route already merged;
// excluded workers (ones the request already failed on) are no sources.
// Called with r.mu held.
func planHint(p *pool, target int, depth [][kv.NumTiers]uint32, seq []kv.SeqHash, exclude []kv.WorkerKey, policy HintPolicy) (HintPlan, bool) {
	t := &p.workers[target].info
	if !t.HintCapable {
		return HintPlan{}, false
	}
	td := depth[target][kv.NumTiers-1]
	if policy != nil {
		return planHintPolicy(p, t, td, depth, seq, exclude, policy)
	}
	best, bestDepth := -1, td
	for i, w := range p.workers {
		if d := depth[i][kv.NumTiers-1]; d > bestDepth && eligibleSource(*t, &w.info) && !slices.Contains(exclude, w.info.Key) {
			best, bestDepth = i, d
		}
	}
	if best < 0 {
		return HintPlan{}, false
	}
	return makePlan(p.workers[best].info, td, bestDepth, seq)
}

// planHintPolicy lists every eligible source and lets policy choose.
func planHintPolicy(p *pool, t *WorkerInfo, td uint32, depth [][kv.NumTiers]uint32, seq []kv.SeqHash, exclude []kv.WorkerKey, policy HintPolicy) (HintPlan, bool) {
	var cands []HintCandidate
	for i, w := range p.workers {
		if d := min(int(depth[i][kv.NumTiers-1]), len(seq)); d > int(td) && eligibleSource(*t, &w.info) && !slices.Contains(exclude, w.info.Key) {
			cands = append(cands, HintCandidate{Worker: w.info, Blocks: d})
		}
	}
	if len(cands) == 0 {
		return HintPlan{}, false
	}
	// The pool is in key order, so a stable sort keeps ties lowest-key first.
	slices.SortStableFunc(cands, func(a, b HintCandidate) int { return b.Blocks - a.Blocks })
	i := policy(*t, int(td), cands)
	if i == HintSkip {
		return HintPlan{}, false
	}
	if i < 0 || i >= len(cands) {
		slog.Warn("KV hint policy chose a source out of range; attaching no hint", "index", i, "candidates", len(cands))
		return HintPlan{}, false
	}
	c := cands[i]
	return makePlan(c.Worker, td, uint32(c.Blocks), seq)
}
