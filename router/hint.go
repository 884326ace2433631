package router

import (
	"log/slog"
	"slices"

	"github.com/kvmesh/kvmesh/kv"
)

// hintPlan is a planned hint before its hashes are resolved: the source
// holds the first blocks blocks of the request, the target (the chosen
// worker) the first target.
type hintPlan struct {
	src    WorkerInfo
	blocks int
	target int
}

// eligibleSource: s may be the hint source of a request routed to target
// (kvcr_hints.md §3.1): another worker key of the same role, model and
// compatibility digest with a control endpoint.
func eligibleSource(target WorkerInfo, s *WorkerInfo) bool {
	return s.Key != target.Key && s.Role.Norm() == target.Role.Norm() &&
		s.Model == target.Model && s.Digest == target.Digest && s.ControlEndpoint != "" &&
		!s.NoKVEvents // its overlap is a prediction, with no engine hashes to name
}

func makePlan(src WorkerInfo, targetDepth, srcDepth uint32, nblocks int) (hintPlan, bool) {
	n := min(int(srcDepth), nblocks)
	if n <= int(targetDepth) {
		return hintPlan{}, false
	}
	return hintPlan{src: src, blocks: n, target: int(targetDepth)}, true
}

// resolveHint turns a plan into the hint the target is sent: the source's
// own engine hashes for the planned prefix, as the index has them from its
// events (a real engine interprets no other hash). The source may have
// evicted blocks since the index was read: the hint then names the shorter
// prefix it still holds, or there is none. Called without r.mu: it takes
// the index's writer lock, and only for decisions that plan a hint.
func (r *Router) resolveHint(id string, pl hintPlan, local []kv.LocalHash) *kv.Hint {
	hashes := r.engHashes.EngineHashes(pl.src.Key, local[:pl.blocks], make([]kv.EngineHash, 0, pl.blocks))
	if len(hashes) <= pl.target {
		return nil
	}
	return &kv.Hint{ID: id, Source: pl.src.Key, Endpoint: pl.src.ControlEndpoint, Hashes: hashes}
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

// planHint picks, for a request of nblocks full blocks routed to target,
// the eligible source with the longest prefix strictly longer than the
// target's (any tier: a peer's host-tier blocks count), ties to the lowest
// key, or lets policy choose (a choice out of range is logged to log); the
// target must be hint-capable. depth is
// what Route merged from the index; excluded workers (ones the request
// already failed on) are no sources. Called with r.mu held.
func planHint(p *pool, target int, depth [][kv.NumTiers]uint32, nblocks int, exclude []kv.WorkerKey, policy HintPolicy, log *slog.Logger) (hintPlan, bool) {
	t := &p.workers[target].info
	if !t.HintCapable {
		return hintPlan{}, false
	}
	td := depth[target][kv.NumTiers-1]
	if policy != nil {
		return planHintPolicy(p, t, td, depth, nblocks, exclude, policy, log)
	}
	best, bestDepth := -1, td
	for i, w := range p.workers {
		if d := depth[i][kv.NumTiers-1]; d > bestDepth && eligibleSource(*t, &w.info) && !slices.Contains(exclude, w.info.Key) {
			best, bestDepth = i, d
		}
	}
	if best < 0 {
		return hintPlan{}, false
	}
	return makePlan(p.workers[best].info, td, bestDepth, nblocks)
}

// planHintPolicy lists every eligible source and lets policy choose.
func planHintPolicy(p *pool, t *WorkerInfo, td uint32, depth [][kv.NumTiers]uint32, nblocks int, exclude []kv.WorkerKey, policy HintPolicy, log *slog.Logger) (hintPlan, bool) {
	var cands []HintCandidate
	for i, w := range p.workers {
		if d := min(int(depth[i][kv.NumTiers-1]), nblocks); d > int(td) && eligibleSource(*t, &w.info) && !slices.Contains(exclude, w.info.Key) {
			cands = append(cands, HintCandidate{Worker: w.info, Blocks: d})
		}
	}
	if len(cands) == 0 {
		return hintPlan{}, false
	}
	// The pool is in key order, so a stable sort keeps ties lowest-key first.
	slices.SortStableFunc(cands, func(a, b HintCandidate) int { return b.Blocks - a.Blocks })
	i := policy(*t, int(td), cands)
	if i == HintSkip {
		return hintPlan{}, false
	}
	if i < 0 || i >= len(cands) {
		log.Warn("KV hint policy chose a source out of range; attaching no hint", "index", i, "candidates", len(cands))
		return hintPlan{}, false
	}
	c := cands[i]
	return makePlan(c.Worker, td, uint32(c.Blocks), nblocks)
}
