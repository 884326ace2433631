// Package ref is the naive reference model of the KV index: a pointer radix
// tree with Go maps everywhere and per-worker engine-hash maps. It defines
// the semantics the fast index in package index must reproduce exactly, and
// the benchmark measures it as the baseline.
//
// It imports only kv, and nothing but tests and bench use it.
package ref

import (
	"sort"

	"github.com/kvmesh/kvmesh/kv"
)

// Match mirrors index.Match (kept separate so ref imports only kv).
type Match struct {
	Worker kv.WorkerKey
	Depth  [kv.NumTiers]uint32
}

// Stats counts what the model dropped or corrected.
type Stats struct {
	Events, Blocks                                  uint64
	ParentNotFound, DuplicateStore, RemoveUnknown   uint64
	Rebound, BadTier, BadKind, UnknownWorkerCleared uint64
}

type node struct {
	parent   *node
	local    kv.LocalHash
	children map[kv.LocalHash]*node
	holders  map[kv.WorkerKey]uint8 // tier mask per worker
}

type holding struct {
	n   *node
	eng kv.EngineHash
}

type worker struct {
	byEng  map[kv.EngineHash]*node
	byNode map[*node]kv.EngineHash // node -> the engine hash this worker uses for it
}

// Index is the reference model. Not safe for concurrent use.
type Index struct {
	root    node
	workers map[kv.WorkerKey]*worker
	st      Stats
}

// New returns an empty model.
func New() *Index {
	return &Index{root: node{children: map[kv.LocalHash]*node{}}, workers: map[kv.WorkerKey]*worker{}}
}

// Stats returns the counters.
func (ix *Index) Stats() Stats { return ix.st }

func (ix *Index) worker(w kv.WorkerKey, create bool) *worker {
	ws := ix.workers[w]
	if ws == nil && create {
		ws = &worker{byEng: map[kv.EngineHash]*node{}, byNode: map[*node]kv.EngineHash{}}
		ix.workers[w] = ws
	}
	return ws
}

func (n *node) child(h kv.LocalHash) *node {
	c := n.children[h]
	if c == nil {
		c = &node{parent: n, local: h, children: map[kv.LocalHash]*node{}, holders: map[kv.WorkerKey]uint8{}}
		n.children[h] = c
	}
	return c
}

// drop removes every tier of w's holding of n and its binding.
func drop(ws *worker, w kv.WorkerKey, n *node) {
	delete(n.holders, w)
	if e, ok := ws.byNode[n]; ok {
		delete(ws.byEng, e)
		delete(ws.byNode, n)
	}
}

// Apply applies one event.
func (ix *Index) Apply(ev kv.Event) {
	ix.st.Events++
	switch ev.Kind {
	case kv.EventStored:
		if !ev.Tier.Valid() {
			ix.st.BadTier++
			return
		}
		ws := ix.worker(ev.Worker, true)
		p := &ix.root
		if ev.HasParent {
			p = ws.byEng[ev.Parent]
			if p == nil {
				ix.st.ParentNotFound++
				return
			}
		}
		bit := uint8(1) << ev.Tier
		for _, b := range ev.Blocks {
			ix.st.Blocks++
			c := p.child(b.LocalHash)
			if old, ok := ws.byEng[b.EngineHash]; ok && old != c {
				ix.st.Rebound++
				drop(ws, ev.Worker, old)
			}
			if e, ok := ws.byNode[c]; ok && e != b.EngineHash {
				ix.st.Rebound++
				delete(ws.byEng, e)
			}
			ws.byEng[b.EngineHash] = c
			ws.byNode[c] = b.EngineHash
			m := c.holders[ev.Worker]
			if m&bit != 0 {
				ix.st.DuplicateStore++
			}
			c.holders[ev.Worker] = m | bit
			p = c
		}
	case kv.EventRemoved:
		if !ev.Tier.Valid() {
			ix.st.BadTier++
			return
		}
		ws := ix.worker(ev.Worker, false)
		bit := uint8(1) << ev.Tier
		for _, h := range ev.Removed {
			ix.st.Blocks++
			var n *node
			if ws != nil {
				n = ws.byEng[h]
			}
			if n == nil || n.holders[ev.Worker]&bit == 0 {
				ix.st.RemoveUnknown++
				continue
			}
			m := n.holders[ev.Worker] &^ bit
			if m == 0 {
				drop(ws, ev.Worker, n)
			} else {
				n.holders[ev.Worker] = m
			}
		}
	case kv.EventCleared:
		ws := ix.worker(ev.Worker, false)
		if ws == nil {
			ix.st.UnknownWorkerCleared++
			return
		}
		ix.clear(ev.Worker, ws)
	default:
		ix.st.BadKind++
	}
}

func (ix *Index) clear(w kv.WorkerKey, ws *worker) {
	for n := range ws.byNode {
		drop(ws, w, n)
	}
}

// RemoveWorker forgets w and everything it holds.
func (ix *Index) RemoveWorker(w kv.WorkerKey) {
	if ws := ix.workers[w]; ws != nil {
		ix.clear(w, ws)
		delete(ix.workers, w)
	}
}

// FindMatches appends one Match per worker holding local[0] on some tier,
// in ascending WorkerKey order. Depth[t] counts the leading blocks the
// worker holds on tier t or a faster one.
func (ix *Index) FindMatches(local []kv.LocalHash, dst []Match) []Match {
	if len(local) == 0 {
		return dst
	}
	first := ix.root.children[local[0]]
	if first == nil || len(first.holders) == 0 {
		return dst
	}
	start := len(dst)
	for w := range first.holders {
		var m Match
		m.Worker = w
		// One walk per worker: cur is the slowest tier needed so far.
		n, cur := &ix.root, 0
		for i, h := range local {
			n = n.children[h]
			var mask uint8
			if n != nil {
				mask = n.holders[w]
			}
			low := kv.NumTiers // lowest tier holding this block
			for t := kv.NumTiers - 1; t >= 0; t-- {
				if mask&(1<<t) != 0 {
					low = t
				}
			}
			for ; cur < low && cur < kv.NumTiers; cur++ {
				m.Depth[cur] = uint32(i)
			}
			if cur == kv.NumTiers {
				break
			}
		}
		for t := cur; t < kv.NumTiers; t++ {
			m.Depth[t] = uint32(len(local))
		}
		dst = append(dst, m)
	}
	out := dst[start:]
	sort.Slice(out, func(i, j int) bool { return Less(out[i].Worker, out[j].Worker) })
	return dst
}

// Less orders worker keys by instance, then DP rank.
func Less(a, b kv.WorkerKey) bool {
	if a.Instance != b.Instance {
		return a.Instance < b.Instance
	}
	return a.DPRank < b.DPRank
}

// Holding is one block a worker holds: its path from the root, the engine
// hash the worker uses for it and its tier mask.
type Holding struct {
	Path   []kv.LocalHash
	Engine kv.EngineHash
	Tiers  uint8
}

// Holdings lists w's holdings sorted by path.
func (ix *Index) Holdings(w kv.WorkerKey) []Holding {
	ws := ix.workers[w]
	if ws == nil {
		return nil
	}
	var out []Holding
	for n, e := range ws.byNode {
		var path []kv.LocalHash
		for p := n; p != &ix.root; p = p.parent {
			path = append(path, p.local)
		}
		for i, j := 0, len(path)-1; i < j; i, j = i+1, j-1 {
			path[i], path[j] = path[j], path[i]
		}
		out = append(out, Holding{Path: path, Engine: e, Tiers: n.holders[w]})
	}
	sort.Slice(out, func(i, j int) bool { return lessPath(out[i].Path, out[j].Path) })
	return out
}

func lessPath(a, b []kv.LocalHash) bool {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return len(a) < len(b)
}

// Workers lists the known workers in ascending order.
func (ix *Index) Workers() []kv.WorkerKey {
	out := make([]kv.WorkerKey, 0, len(ix.workers))
	for w := range ix.workers {
		out = append(out, w)
	}
	sort.Slice(out, func(i, j int) bool { return Less(out[i], out[j]) })
	return out
}

// BlockCounts returns how many blocks w holds on each tier.
func (ix *Index) BlockCounts(w kv.WorkerKey) (c [kv.NumTiers]int) {
	if ws := ix.workers[w]; ws != nil {
		for n := range ws.byNode {
			m := n.holders[w]
			for t := 0; t < kv.NumTiers; t++ {
				if m&(1<<t) != 0 {
					c[t]++
				}
			}
		}
	}
	return c
}
