package index

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/internal/mix"
	"github.com/kvmesh/kvmesh/kv"
)

// Sharded spreads workers over independent indexes by worker key. One
// Index serialises every writer on its lock, and applying events is most
// of an index's work; shards apply in parallel, one writer each, and a
// worker's events stay in order because they all reach the same shard.
// Finds stay lock-free: a find asks every shard and merges the answers,
// which are disjoint (a worker lives in exactly one shard).
//
// The price is memory: a block held by workers of several shards has a
// node in each (docs/benchmarks.md has the figures).
//
// Wide answers (every live worker holding the query's start, as a shared
// system prompt makes them) are not merged: each shard writes its workers
// straight to their places in the answer, which a placement kept by the
// writers gives (see placement).
type Sharded struct {
	shards []*Index
	merge  sync.Pool // *mergeScratch
	pmu    sync.Mutex
	place  atomic.Pointer[placement]
}

// placement is where each shard's workers go in a merged answer: made
// for the shards' views in views, pos[k][sl] is the rank of shard k's
// worker in slot sl among every shard's workers (by slot, so a find
// reads its keys and depths in order and only its stores are spread;
// a slot not live in the view has a stale entry), n their number.
//
// A shard that publishes a view (a worker joined or left) only swaps its
// view in, under pmu, and marks the placement stale: ranks shift for
// every worker after the one that came or went, so keeping pos current
// cost O(workers) per join, and thousands of workers join in a replay's
// warm-up. The first find that meets a stale placement ranks everyone
// again (one merge of the shards' sorted orders, O(workers)) and
// publishes it, so a run of joins between two finds costs one ranking.
// A find reads each shard through the placement's view of it, which is
// at least as new as any event applied before the find began.
type placement struct {
	views []*view
	pos   [][]uint32 // valid only when !stale
	n     int
	stale bool
}

type mergeScratch struct{ a, b, c []Match }

// NewSharded returns n empty shards (at least one) tuned by cfg.
func NewSharded(n int, cfg Config) *Sharded {
	s := &Sharded{shards: make([]*Index, max(1, n))}
	p := &placement{views: make([]*view, len(s.shards)), pos: make([][]uint32, len(s.shards))}
	for i := range s.shards {
		sh := NewWith(cfg)
		s.shards[i] = sh
		p.views[i] = sh.vw.Load()
		sh.onView = func(v *view) { s.viewChanged(i, v) }
	}
	s.place.Store(p)
	s.merge.New = func() any { return new(mergeScratch) }
	return s
}

// viewChanged swaps shard k's new view v into the placement and marks
// it stale (see placement): O(shards), whatever the number of workers.
func (s *Sharded) viewChanged(k int, v *view) {
	s.pmu.Lock()
	p := s.place.Load()
	np := &placement{views: slices.Clone(p.views), pos: p.pos, n: p.n, stale: true}
	np.views[k] = v
	s.place.Store(np)
	s.pmu.Unlock()
}

// placed returns a placement that is not stale for views at least as new
// as p's, ranking the workers again if p is stale, or nil when another
// find is ranking them now (this one then merges the shards' answers
// rather than wait).
func (s *Sharded) placed(p *placement) *placement {
	if !p.stale {
		return p
	}
	if !s.pmu.TryLock() {
		return nil
	}
	defer s.pmu.Unlock()
	p = s.place.Load()
	if !p.stale {
		return p
	}
	np := &placement{views: p.views, pos: make([][]uint32, len(p.views))}
	np.placeAll()
	s.place.Store(np)
	return np
}

// placeAll computes p.pos from scratch for p.views: a merge of the
// views' orders, which are sorted already.
func (p *placement) placeAll() {
	n := 0
	for k, v := range p.views {
		p.pos[k] = make([]uint32, len(v.keys))
		n += len(v.slotOf)
	}
	if len(p.views) == 2 {
		merge2(p.views[0], p.views[1], p.pos[0], p.pos[1])
	} else {
		heads := make([]int, len(p.views))
		for g := range n {
			// The shard whose next worker comes first (few shards: a scan).
			best := -1
			var bw kv.WorkerKey
			for k, v := range p.views {
				if h := heads[k]; h < len(v.slotOf) {
					if w := v.keys[v.slotOf[h]]; best < 0 || less(w, bw) {
						best, bw = k, w
					}
				}
			}
			v := p.views[best]
			p.pos[best][v.slotOf[heads[best]]] = uint32(g)
			heads[best]++
		}
	}
	p.n = n
	p.stale = false
}

// merge2 ranks the workers of two views into pa and pb. Their keys
// interleave at random, so the merge picks a side without a branch (a
// conditional move of the store's target and of the advance).
func merge2(va, vb *view, pa, pb []uint32) {
	a, b := va.slotOf, vb.slotOf
	i, j, g := 0, 0, uint32(0)
	for i < len(a) && j < len(b) {
		sa, sb := a[i], b[j]
		t := &pa[sa]
		d := 0
		if less(vb.keys[sb], va.keys[sa]) {
			t, d = &pb[sb], 1
		}
		*t = g
		g++
		i += 1 - d
		j += d
	}
	for ; i < len(a); i++ {
		pa[a[i]] = g
		g++
	}
	for ; j < len(b); j++ {
		pb[b[j]] = g
		g++
	}
}

func cmpKey(a, b kv.WorkerKey) int {
	switch {
	case less(a, b):
		return -1
	case less(b, a):
		return 1
	}
	return 0
}

// Shards is the number of shards.
func (s *Sharded) Shards() int { return len(s.shards) }

// ShardOf is the shard that holds w's blocks. Callers that apply events
// from several goroutines give each shard its own, so no writer ever
// waits on another.
func (s *Sharded) ShardOf(w kv.WorkerKey) int {
	if len(s.shards) == 1 {
		return 0
	}
	return int(mix.Mix64(w.Instance*mix.Golden^uint64(w.DPRank)) % uint64(len(s.shards)))
}

// Apply applies one KV event to its worker's shard.
func (s *Sharded) Apply(ev kv.Event) { s.shards[s.ShardOf(ev.Worker)].Apply(ev) }

// RemoveWorker drops everything w holds and forgets w.
func (s *Sharded) RemoveWorker(w kv.WorkerKey) { s.shards[s.ShardOf(w)].RemoveWorker(w) }

// BlockCounts returns how many blocks w holds on each tier.
func (s *Sharded) BlockCounts(w kv.WorkerKey) [kv.NumTiers]int {
	return s.shards[s.ShardOf(w)].BlockCounts(w)
}

// FindMatches is Index.FindMatches over every shard: one Match per worker
// holding the query's first block, in ascending WorkerKey order. Each
// shard's answer is read atomically as Index.FindMatches reads it; shards
// are read one after another, and the last merge writes into dst.
func (s *Sharded) FindMatches(local []kv.LocalHash, dst []Match) []Match {
	if len(s.shards) == 1 {
		return s.shards[0].FindMatches(local, dst)
	}
	if len(local) == 0 {
		return dst
	}
	// Every worker matched in every shard (a shared prefix): each shard
	// writes its answer into place.
	n0 := len(dst)
	placed := false
	if p := s.placed(s.place.Load()); p != nil {
		dst = slices.Grow(dst, p.n)[:n0+p.n]
		sp := scatter{out: dst[n0:]}
		placed = true
		for k, sh := range s.shards {
			sp.v, sp.pos = p.views[k], p.pos[k]
			if !sh.findScatter(local, &sp) {
				placed = false
				break
			}
		}
	}
	if placed {
		return dst
	}
	dst = dst[:n0]
	sc := s.merge.Get().(*mergeScratch)
	sc.a = s.shards[0].FindMatches(local, sc.a[:0])
	for k, sh := range s.shards[1:] {
		sc.b = sh.FindMatches(local, sc.b[:0])
		if k == len(s.shards)-2 {
			dst = mergeMatches(dst, sc.a, sc.b)
			break
		}
		sc.c = mergeMatches(sc.c[:0], sc.a, sc.b)
		sc.a, sc.c = sc.c, sc.a
	}
	s.merge.Put(sc)
	return dst
}

// mergeMatches appends the union of a and b, both in ascending WorkerKey
// order and disjoint, to dst in that order. Workers of two shards
// interleave at random, so the branch choosing a side mispredicts about
// every other step whatever the loop looks like (a branch-free pick was
// slower: its loads chain through the pick); this one at least writes
// into a presized dst.
func mergeMatches(dst, a, b []Match) []Match {
	n0 := len(dst)
	dst = slices.Grow(dst, len(a)+len(b))[:n0+len(a)+len(b)]
	out := dst[n0:]
	i, j, k := 0, 0, 0
	if len(a) > 0 && len(b) > 0 {
		x, y := a[0].Worker, b[0].Worker
		for {
			if less(y, x) {
				out[k] = b[j]
				j++
				k++
				if j == len(b) {
					break
				}
				y = b[j].Worker
			} else {
				out[k] = a[i]
				i++
				k++
				if i == len(a) {
					break
				}
				x = a[i].Worker
			}
		}
	}
	k += copy(out[k:], a[i:])
	copy(out[k:], b[j:])
	return dst
}

func (s *Sharded) Workers() []kv.WorkerKey {
	var out []kv.WorkerKey
	for _, sh := range s.shards {
		out = append(out, sh.Workers()...)
	}
	slices.SortFunc(out, cmpKey)
	return out
}

// Stats sums the shards' counters (Nodes counts a node per shard that
// has it).
func (s *Sharded) Stats() Stats {
	var t Stats
	for _, sh := range s.shards {
		x := sh.Stats()
		t.Events += x.Events
		t.Blocks += x.Blocks
		t.ParentNotFound += x.ParentNotFound
		t.DuplicateStore += x.DuplicateStore
		t.RemoveUnknown += x.RemoveUnknown
		t.Rebound += x.Rebound
		t.BadTier += x.BadTier
		t.BadKind += x.BadKind
		t.UnknownWorkerCleared += x.UnknownWorkerCleared
		t.TooManyWorkers += x.TooManyWorkers
		t.Nodes += x.Nodes
		t.Holdings += x.Holdings
		t.Overflow += x.Overflow
		t.HolderSets += x.HolderSets
		t.ReadRetries += x.ReadRetries
	}
	return t
}
