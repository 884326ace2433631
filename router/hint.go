package router

import (
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
	return s.Key != target.Key && s.Role.norm() == target.Role.norm() &&
		s.Model == target.Model && s.Digest == target.Digest && s.ControlEndpoint != ""
}

func makePlan(src WorkerInfo, targetDepth, srcDepth uint32, seq []kv.SeqHash) (HintPlan, bool) {
	n := min(int(srcDepth), len(seq))
	if n <= int(targetDepth) {
		return HintPlan{}, false
	}
	return HintPlan{Source: src.Key, Endpoint: src.ControlEndpoint, SeqHashes: seq[:n:n], TargetBlocks: int(targetDepth)}, true
}

// planHint is PlanHint over a pool, with the depths Route already merged;
// excluded workers (ones the request already failed on) are no sources.
// Called with r.mu held.
func planHint(p *pool, target int, depth [][kv.NumTiers]uint32, seq []kv.SeqHash, exclude []kv.WorkerKey) (HintPlan, bool) {
	t := &p.workers[target].info
	if !t.HintCapable {
		return HintPlan{}, false
	}
	td := depth[target][kv.NumTiers-1]
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
