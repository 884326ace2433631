package index

import (
	"slices"
	"sort"
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
// a slot not live in the view has a stale entry), n their number. A
// shard that publishes a view updates it (under pmu, O(workers) copies
// per worker joining or leaving), and a find reads each shard through
// the placement's view of it, which is at least as new as any event
// applied before the find began.
type placement struct {
	views []*view
	pos   [][]uint32
	n     int
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
		sh.onView = func(old, v *view, slot uint32, on bool) { s.viewChanged(i, old, v, slot, on) }
	}
	s.place.Store(p)
	s.merge.New = func() any { return new(mergeScratch) }
	return s
}

// rankIn is the number of v's live workers with keys below w.
func rankIn(v *view, w kv.WorkerKey) int {
	return sort.Search(len(v.slotOf), func(i int) bool { return !less(v.keys[v.slotOf[i]], w) })
}

// viewChanged updates the placement for shard k's new view v, in which
// slot joined (on) or left old: every worker ranked after it moves by one.
func (s *Sharded) viewChanged(k int, old, v *view, slot uint32, on bool) {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	p := s.place.Load()
	np := &placement{views: slices.Clone(p.views), pos: make([][]uint32, len(p.pos))}
	np.views[k] = v
	if p.views[k] != old {
		np.placeAll() // not a successor of the placement's view
		s.place.Store(np)
		return
	}
	if on {
		w := v.keys[slot]
		g := uint32(0)
		for t, tv := range p.views {
			if t != k {
				g += uint32(rankIn(tv, w))
			} else {
				g += uint32(rankIn(v, w))
			}
		}
		for t, ps := range p.pos {
			n := len(ps)
			if t == k {
				n = max(n, len(v.keys))
			}
			q := shifted(make([]uint32, n), ps, g, 1)
			if t == k {
				q[slot] = g
			}
			np.pos[t] = q
		}
		np.n = p.n + 1
	} else {
		g := p.pos[k][slot]
		for t, ps := range p.pos {
			np.pos[t] = shifted(make([]uint32, len(ps)), ps, g+1, ^uint32(0))
		}
		np.n = p.n - 1
	}
	s.place.Store(np)
}

// shifted copies src to the start of dst adding d (1 or -1 as ^0) to
// every position at or past g, and returns dst.
func shifted(dst, src []uint32, g, d uint32) []uint32 {
	for i, x := range src {
		if x >= g {
			x += d
		}
		dst[i] = x
	}
	return dst
}

// placeAll computes p.pos from scratch for p.views.
func (p *placement) placeAll() {
	type at struct {
		w     kv.WorkerKey
		k, sl int
	}
	var all []at
	for k, v := range p.views {
		for _, sl := range v.slotOf {
			all = append(all, at{v.keys[sl], k, int(sl)})
		}
	}
	slices.SortFunc(all, func(a, b at) int { return cmpKey(a.w, b.w) })
	for k, v := range p.views {
		p.pos[k] = make([]uint32, len(v.keys))
	}
	for g, a := range all {
		p.pos[a.k][a.sl] = uint32(g)
	}
	p.n = len(all)
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
	p := s.place.Load()
	n0 := len(dst)
	dst = slices.Grow(dst, p.n)[:n0+p.n]
	sp := scatter{out: dst[n0:]}
	placed := true
	for k, sh := range s.shards {
		sp.v, sp.pos = p.views[k], p.pos[k]
		if !sh.findScatter(local, &sp) {
			placed = false
			break
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
