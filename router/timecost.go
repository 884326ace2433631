package router

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/kvmesh/kvmesh/kv"
)

// CostKind names the cost model a CostModel evaluates.
type CostKind string

const (
	// CostBlocks is DESIGN.md §5's block model (Dynamo's): prefill blocks
	// left after the cache credit, plus active decode blocks. The empty
	// kind means CostBlocks, so models written before Kind existed keep
	// their meaning.
	CostBlocks CostKind = "blocks"
	// CostTime predicts the request's time to first token on each worker,
	// in ms, from the worker's timing model (see CostModel).
	CostTime CostKind = "time"
)

// CostKinds lists the cost kinds, for help texts.
var CostKinds = []CostKind{CostBlocks, CostTime}

// ParseCostKind accepts "blocks" or "time" (case-insensitive).
func ParseCostKind(s string) (CostKind, error) {
	switch k := CostKind(strings.ToLower(strings.TrimSpace(s))); k {
	case CostBlocks, CostTime:
		return k, nil
	}
	return "", fmt.Errorf("unknown router cost %q (want blocks or time)", s)
}

// EngineTiming is a worker's forward-pass timing model as the router predicts
// it: a pass that computes x new prompt tokens (summed over its requests)
// costs PrefillMS(x), and a pass that samples tokens while the engine's KV
// cache is a fraction p in use adds DecodeMS(p). The zero value means
// DefaultEngineTiming. The coefficients are the router's own copy of engine/sim's
// Polynomial (the mocker's default), which the router may not import.
type EngineTiming struct {
	// PrefillMS(x) = Prefill[0]·x² + Prefill[1]·x + Prefill[2] for x > 0, 0 for x = 0.
	Prefill [3]float64
	// DecodeMS(p) = max(DecodeFloor, Decode[0]·p² + Decode[1]·p + Decode[2]), p clamped to [0, 1].
	Decode      [3]float64
	DecodeFloor float64
}

// DefaultEngineTiming is engine/sim's Polynomial: Dynamo's mocker timing model.
func DefaultEngineTiming() EngineTiming {
	return EngineTiming{
		Prefill:     [3]float64{4.209989e-07, 1.518344e-02, 16.50142},
		Decode:      [3]float64{-25.74, 54.01, 5.74},
		DecodeFloor: 1,
	}
}

func (t EngineTiming) orDefault() EngineTiming {
	if t == (EngineTiming{}) {
		return DefaultEngineTiming()
	}
	return t
}

func (t EngineTiming) validate() error {
	for _, v := range append(append(t.Prefill[:], t.Decode[:]...), t.DecodeFloor) {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("timing coefficient %v is not finite", v)
		}
	}
	// Prefill time must not fall with more work, or "less cached" could
	// look cheaper.
	if t.Prefill[0] < 0 || t.Prefill[1] < 0 || t.Prefill[2] < 0 {
		return fmt.Errorf("prefill coefficients %v must be ≥ 0", t.Prefill)
	}
	if t.DecodeFloor < 0 {
		return fmt.Errorf("decode floor %v must be ≥ 0", t.DecodeFloor)
	}
	return nil
}

// PrefillMS is the modelled time of one pass computing x new prompt tokens.
func (t *EngineTiming) PrefillMS(x float64) float64 {
	if x <= 0 {
		return 0
	}
	p := &t.Prefill
	return (p[0]*x+p[1])*x + p[2]
}

// DecodeMS is the modelled decode time of one pass at KV utilisation p.
func (t *EngineTiming) DecodeMS(p float64) float64 {
	p = min(max(p, 0), 1)
	d := &t.Decode
	return max(t.DecodeFloor, (d[0]*p+d[1])*p+d[2])
}

// PrefillWork is the modelled prefill time of tokens new prompt tokens
// computed in chunks of at most budget per pass (chunked prefill), and the
// number of passes that takes.
func (t *EngineTiming) PrefillWork(tokens float64, budget int) (ms float64, passes int) {
	if tokens <= 0 {
		return 0, 0
	}
	b := float64(budget)
	if budget <= 0 || tokens <= b {
		return t.PrefillMS(tokens), 1
	}
	full := math.Floor(tokens / b)
	rest := tokens - full*b
	ms = full * t.PrefillMS(b)
	passes = int(full)
	if rest > 0 {
		ms += t.PrefillMS(rest)
		passes++
	}
	return ms, passes
}

// TierLoad is a worker's onboarding cost: the modelled ms to bring one
// block from each tier onto its device (the TierDevice entry is unused).
// A tier at 0 is unknown and its blocks earn the cost model's fixed
// credit (CostModel.Host, Disk, External); a known tier's blocks count as
// cached and the time cost adds the wait for their load instead.
type TierLoad [kv.NumTiers]float64

func (t TierLoad) validate() error {
	for i, v := range t {
		if !(v >= 0) || math.IsInf(v, 0) {
			return fmt.Errorf("tier %s load %v ms per block must be finite and ≥ 0", kv.Tier(i), v)
		}
	}
	return nil
}

// ParseTierLoad reads per-block load times as "host=0.17,disk=1.2,
// external=2.8" (ms; tier names as kv.ParseTier takes them, "object" for
// external). The device tier loads nothing and may not be named; an empty
// string is the zero TierLoad (unknown: fixed credits).
func ParseTierLoad(s string) (TierLoad, error) {
	var out TierLoad
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	seen := [kv.NumTiers]bool{}
	for _, part := range strings.Split(s, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return TierLoad{}, fmt.Errorf("tier load %q: want tier=ms", part)
		}
		name = strings.TrimSpace(name)
		if strings.EqualFold(name, "object") {
			name = kv.TierExternal.String()
		}
		t, err := kv.ParseTier(name)
		if err != nil {
			return TierLoad{}, fmt.Errorf("tier load %q: %w", part, err)
		}
		if t == kv.TierDevice {
			return TierLoad{}, fmt.Errorf("tier load %q: the device tier loads nothing (want host, disk or external)", part)
		}
		if seen[t] {
			return TierLoad{}, fmt.Errorf("tier load %q: tier %s given twice", part, t)
		}
		seen[t] = true
		ms, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil || !(ms > 0) || math.IsInf(ms, 0) {
			return TierLoad{}, fmt.Errorf("tier load %q: want a finite ms per block > 0", part)
		}
		out[t] = ms
	}
	return out, nil
}

// defaultPassBudget is the token budget per pass assumed for workers that
// do not report MaxBatchedTokens (the sim's and vLLM's default).
const defaultPassBudget = 8192

// costInput is what the cost models read about one candidate worker.
type costInput struct {
	depth   [kv.NumTiers]uint32
	load    *load
	timing  *EngineTiming // already defaulted
	budget  int           // tokens per pass (> 0)
	kvCap   int           // device KV blocks (0: unknown)
	usage   float64       // reported KV usage fraction, 0 when none is fresh
	blockSz int
	// tierMS and backlogMS (CostTime): per-block load times of the
	// worker's tiers and what its onboarding channel still has queued.
	tierMS    TierLoad
	backlogMS float64
	// noCharge: the prompt is not computed here (a decode leg), so it adds
	// no prefill time; its blocks still count toward KV usage.
	noCharge bool
}

// credit is the cache credit in blocks (both models): prefix blocks held
// per tier, weighted by how cheap each tier is to use.
func (m *CostModel) credit(depth [kv.NumTiers]uint32) float64 {
	dev := float64(depth[kv.TierDevice])
	host := float64(depth[kv.TierHost] - min(depth[kv.TierHost], depth[kv.TierDevice]))
	disk := float64(depth[kv.TierDisk] - min(depth[kv.TierDisk], depth[kv.TierHost]))
	ext := float64(depth[kv.TierExternal] - min(depth[kv.TierExternal], depth[kv.TierDisk]))
	return m.Device*dev + m.Host*host + m.Disk*disk + m.External*ext
}

// timedCredit is the time model's cache credit in blocks and the load
// time its tier blocks cost on the worker (ms, 0 when nothing loads).
// Blocks of a tier with a known load time count in full, as the engine
// loads every block it matches rather than recompute it; the load starts
// behind what the onboarding channel still has queued.
func (m *CostModel) timedCredit(in *costInput) (credit, loadMS float64) {
	if in.tierMS == (TierLoad{}) {
		return m.credit(in.depth), 0
	}
	d := &in.depth
	credit = m.Device * float64(d[kv.TierDevice])
	weight := [kv.NumTiers]float64{kv.TierHost: m.Host, kv.TierDisk: m.Disk, kv.TierExternal: m.External}
	for t := kv.TierHost; t < kv.NumTiers; t++ {
		n := float64(d[t] - min(d[t], d[t-1]))
		if ms := in.tierMS[t]; ms > 0 {
			credit += n
			loadMS += n * ms
		} else {
			credit += weight[t] * n
		}
	}
	if loadMS > 0 {
		loadMS += in.backlogMS
	}
	return credit, loadMS
}

// admitWait is how long the request waits for device KV on the worker
// (ms): when its blocks do not fit beside those in use, it is admitted as
// running requests finish and free theirs, which they do at about
// occupied/residency blocks per ms (residency: how long the worker's
// requests stay, observed by Done). A tier credit promises a prefix the
// device must hold again while the request runs, so without this a worker
// that holds a conversation in host memory keeps attracting it however
// full its device is.
//
//	occupied = max(active blocks, reported usage·capacity)
//	over     = occupied + this request's new blocks − capacity
//	wait     = residency · min(over/occupied, 1)                  over > 0
func admitWait(in *costInput, seq []kv.SeqHash, isl float64) float64 {
	l := in.load
	if l.residencyMS <= 0 {
		return 0
	}
	occupied := max(float64(l.uniqueBlocks()), in.usage*float64(in.kvCap))
	need := math.Ceil(isl/float64(in.blockSz)) - float64(l.activePrefix(seq))
	over := occupied + need - float64(in.kvCap)
	if over <= 0 || occupied <= 0 {
		return 0
	}
	return l.residencyMS * min(over/occupied, 1)
}

// timeCost is the CostTime model: the request's predicted time to first
// token on the worker, in ms.
//
//	new     = max(ISL − credit·block_size, 0)                 tokens this request computes
//	queued  = active_prefill_tokens + new                     prefill ahead of and including it
//	prefill = Σ PrefillMS(chunk) over queued in chunks of MaxBatchedTokens
//	passes  = ⌈queued / MaxBatchedTokens⌉
//	decode  = passes · DecodeMS(KV usage with this request's blocks added)
//	own     = Σ PrefillMS(chunk) over new alone
//	load    = backlog + Σ tier blocks · tier load ms            (known tiers only)
//	wait    = max(load − PrefillMS(active_prefill_tokens), 0)
//	admit   = the wait for device KV (admitWait; workers with tiers only)
//	cost    = PrefillScale·prefill + WorkWeight·own + decode + wait + admit
//
// prefill + decode is the request's own TTFT. The prefill polynomial is
// superlinear inside a pass, so a cache hit is worth more on a long prompt;
// the decode term is what the worker's running decodes add to every pass,
// so with equal prefixes and queues the request goes where the KV cache is
// least used. TTFT alone is greedy: it sends a conversation's next turn to
// an idle worker to recompute its prefix there, which delays whatever
// arrives at that worker next and spends cache on a second copy. own is that
// externality: the time this request occupies the worker, which everything
// queued behind it waits for. A request with a tier load runs in the first
// pass after its load lands, while the worker computes what is queued ahead
// of it: wait is the part of its load that computing cannot hide, so a
// worker whose onboarding channel is backed up is worth less, and a tier
// slower to load than to recompute is worth less than nothing.
func (m *CostModel) timeCost(in *costInput, seq []kv.SeqHash, isl float64) float64 {
	l := in.load
	charge := isl
	if in.noCharge {
		charge = 0
	}
	credit, loadMS := m.timedCredit(in)
	if in.noCharge {
		loadMS = 0 // nothing is computed here, so nothing waits to load
	}
	cached := min(credit*float64(in.blockSz), charge)
	queued := float64(l.prefillTokens) + charge - cached
	prefill, passes := in.timing.PrefillWork(queued, in.budget)
	if passes == 0 {
		passes = 1 // the first token is still sampled in a pass
	}
	u := in.usage
	if in.kvCap > 0 {
		reqBlocks := math.Ceil(isl / float64(in.blockSz))
		active := float64(l.uniqueBlocks()) + reqBlocks - float64(l.activePrefix(seq))
		u = max(u, active/float64(in.kvCap))
	}
	own := prefill // nothing queued ahead: queued is charge−cached exactly
	if l.prefillTokens != 0 {
		own, _ = in.timing.PrefillWork(charge-cached, in.budget)
	}
	cost := m.PrefillScale*prefill + m.WorkWeight*own + float64(passes)*in.timing.DecodeMS(u)
	if loadMS > 0 {
		ahead, _ := in.timing.PrefillWork(float64(l.prefillTokens), in.budget)
		cost += max(loadMS-ahead, 0)
	}
	if in.tierMS != (TierLoad{}) && in.kvCap > 0 {
		cost += admitWait(in, seq, isl)
	}
	return cost
}
