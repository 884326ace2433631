package index

import (
	"container/heap"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// Approximate-index defaults (Dynamo's --router-ttl-secs and max tree size).
const (
	DefaultApproxTTL      = 120 * time.Second
	DefaultApproxCapacity = 1 << 20
)

// Approx is the index for workers that publish no KV events: the router
// inserts each request's blocks under the worker it chose, and they expire
// after a TTL. It stores into an event-driven Index (device tier, engine
// hash = the chained sequence hash of the local hashes), so FindMatches is
// the same lock-free read; Depth is equal on every tier. Time is passed in,
// so it runs under a virtual clock; expiry happens on Insert and Expire.
type Approx struct {
	ix  *Index
	ttl time.Duration
	cap int

	mu      sync.Mutex
	entries map[approxKey]approxEntry
	h       approxHeap
	seq     []kv.SeqHash
	blocks  []kv.StoredBlock
}

type approxKey struct {
	w   kv.WorkerKey
	seq kv.SeqHash
}

type approxEntry struct {
	exp   int64 // unix nanoseconds
	depth uint32
}

type approxItem struct {
	approxKey
	approxEntry
}

// approxHeap orders by expiry, then deeper first (leaves before prefixes).
type approxHeap []approxItem

func (h approxHeap) Len() int { return len(h) }
func (h approxHeap) Less(i, j int) bool {
	if h[i].exp != h[j].exp {
		return h[i].exp < h[j].exp
	}
	return h[i].depth > h[j].depth
}
func (h approxHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *approxHeap) Push(x any)   { *h = append(*h, x.(approxItem)) }
func (h *approxHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// NewApprox returns an approximate index; ttl ≤ 0 and capacity ≤ 0 take
// the defaults.
func NewApprox(ttl time.Duration, capacity int) *Approx {
	if ttl <= 0 {
		ttl = DefaultApproxTTL
	}
	if capacity <= 0 {
		capacity = DefaultApproxCapacity
	}
	return &Approx{ix: New(), ttl: ttl, cap: capacity, entries: map[approxKey]approxEntry{}}
}

// Insert records that w now holds local (routed at now), refreshing the TTL
// of blocks it already held, then expires and prunes.
func (a *Approx) Insert(w kv.WorkerKey, local []kv.LocalHash, now time.Time) {
	if len(local) == 0 {
		a.Expire(now)
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	exp := now.Add(a.ttl).UnixNano()
	a.seq = kv.SeqHashes(a.seq[:0], local)
	a.blocks = a.blocks[:0]
	for i, s := range a.seq {
		k := approxKey{w, s}
		e := approxEntry{exp: exp, depth: uint32(i + 1)}
		a.entries[k] = e
		heap.Push(&a.h, approxItem{k, e})
		a.blocks = append(a.blocks, kv.StoredBlock{EngineHash: s, LocalHash: local[i]})
	}
	a.ix.Apply(kv.Stored(w, kv.TierDevice, nil, a.blocks))
	a.expire(now.UnixNano())
	if len(a.entries) > a.cap {
		a.prune(a.cap * 8 / 10)
	}
	// Drop stale heap items when they dominate.
	if len(a.h) > 4*len(a.entries)+1024 {
		a.h = a.h[:0]
		for k, e := range a.entries {
			a.h = append(a.h, approxItem{k, e})
		}
		heap.Init(&a.h)
	}
}

// Expire removes every entry whose TTL has passed at now.
func (a *Approx) Expire(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.expire(now.UnixNano())
}

func (a *Approx) expire(now int64) {
	for len(a.h) > 0 && a.h[0].exp <= now {
		a.popOne()
	}
}

func (a *Approx) prune(target int) {
	for len(a.entries) > target && len(a.h) > 0 {
		a.popOne()
	}
}

// popOne removes the heap minimum if it is still current.
func (a *Approx) popOne() {
	it := heap.Pop(&a.h).(approxItem)
	if cur, ok := a.entries[it.approxKey]; !ok || cur != it.approxEntry {
		return // refreshed or already gone
	}
	delete(a.entries, it.approxKey)
	a.ix.Apply(kv.Removed(it.w, kv.TierDevice, []uint64{it.seq}))
}

// Len is the number of (worker, block) entries.
func (a *Approx) Len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.entries)
}

// RemoveWorker forgets w.
func (a *Approx) RemoveWorker(w kv.WorkerKey) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k := range a.entries {
		if k.w == w {
			delete(a.entries, k)
		}
	}
	a.ix.RemoveWorker(w)
}

// FindMatches is Index.FindMatches over the approximate holdings.
func (a *Approx) FindMatches(local []kv.LocalHash, dst []Match) []Match {
	return a.ix.FindMatches(local, dst)
}
