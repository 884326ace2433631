package index

import (
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/internal/u64map"
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
//
// Expiry. Every Insert's blocks share one expiry (now + TTL), so an insert
// is one record in a FIFO queue, and a (worker, block) entry remembers the
// stamp of the last insert that touched it: popping a record expires the
// entries still stamped with it, deepest first. Expiries enter the queue
// in order because time does not go back; if a caller's clock does, the
// expiry is clamped to the latest one queued (the TTL stretches a little).
// An ancestor block is stamped by every insert that stamps its
// descendants, so expiry and pruning keep each worker's holdings
// prefix-closed, and an insert only has to store its new suffix.
type Approx struct {
	ix  *Index
	ttl time.Duration
	cap int

	mu      sync.Mutex
	workers map[kv.WorkerKey]*approxWorker
	n       int    // entries over all workers
	stamp   uint64 // last insert's stamp
	lastExp int64  // latest expiry queued (unix ns)
	q       []approxRec
	head    int          // q[head:] are pending
	qseq    []kv.SeqHash // the records' blocks
	seq     []kv.SeqHash
	blocks  []kv.StoredBlock
	rm      []kv.EngineHash
	touched kv.SeqHash // keeps the warming loads
}

// popWarm is how many stamps popRec touches ahead at a time: their misses
// overlap, and a record that stops early wastes at most this many.
const popWarm = 16

type approxWorker struct {
	key  kv.WorkerKey
	last u64map.Map[kv.SeqHash, uint64] // block -> stamp (never 0) of the last insert holding it
	gone bool                           // removed: its pending records are void
}

// approxRec is one insert: qseq[off:off+n] stamped stamp under w, expiring
// at exp. Pruning may shrink n (the deepest blocks go first).
type approxRec struct {
	w      *approxWorker
	exp    int64
	stamp  uint64
	off, n int
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
	return &Approx{ix: New(), ttl: ttl, cap: capacity, workers: map[kv.WorkerKey]*approxWorker{}}
}

// Insert records that w now holds local (routed at now), refreshing the TTL
// of blocks it already held, then expires and prunes.
func (a *Approx) Insert(w kv.WorkerKey, local []kv.LocalHash, now time.Time) {
	a.InsertSeq(w, local, nil, now)
}

// InsertSeq is Insert with seq, the sequence hashes of local
// (kv.SeqHashes), when the caller has them; nil (or a length other than
// local's): Insert computes them.
func (a *Approx) InsertSeq(w kv.WorkerKey, local []kv.LocalHash, seq []kv.SeqHash, now time.Time) {
	if len(local) == 0 {
		a.Expire(now)
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	exp := max(now.Add(a.ttl).UnixNano(), a.lastExp)
	a.lastExp = exp
	aw := a.workers[w]
	if aw == nil {
		aw = &approxWorker{key: w}
		a.workers[w] = aw
	}
	a.stamp++
	off := len(a.qseq)
	if len(seq) == len(local) {
		a.qseq = append(a.qseq, seq...)
	} else {
		a.qseq = kv.SeqHashes(a.qseq, local)
	}
	a.seq = a.qseq[off:]
	// Stamp every block; the held ones form a prefix, so the first block
	// that grows the map starts the suffix the index lacks.
	var touch kv.SeqHash
	for _, s := range a.seq {
		touch += aw.last.Touch(s) // the stamps' misses overlap
	}
	a.touched += touch
	first := -1
	for i, s := range a.seq {
		if aw.last.Set(s, a.stamp) && first < 0 {
			first = i
		}
	}
	a.q = append(a.q, approxRec{w: aw, exp: exp, stamp: a.stamp, off: off, n: len(a.seq)})
	if first >= 0 {
		a.n += len(a.seq) - first
		a.blocks = a.blocks[:0]
		for i := first; i < len(a.seq); i++ {
			// The approximate index plays the engine: its engine hash is
			// the block's sequence hash.
			a.blocks = append(a.blocks, kv.StoredBlock{EngineHash: kv.EngineHash(a.seq[i]), LocalHash: local[i]})
		}
		var parent *kv.EngineHash
		if first > 0 {
			p := kv.EngineHash(a.seq[first-1])
			parent = &p
		}
		a.ix.Apply(kv.Stored(w, kv.TierDevice, parent, a.blocks))
	}
	a.expire(now.UnixNano())
	if a.n > a.cap {
		a.prune(a.cap * 8 / 10)
	}
}

// Expire removes every entry whose TTL has passed at now.
func (a *Approx) Expire(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.expire(now.UnixNano())
}

func (a *Approx) expire(now int64) {
	for a.head < len(a.q) && a.q[a.head].exp <= now {
		a.popRec(-1)
	}
	a.compact()
}

// prune expires entries early, oldest and deepest first, down to target.
func (a *Approx) prune(target int) {
	for a.n > target && a.head < len(a.q) {
		a.popRec(target)
	}
	a.compact()
}

// popRec expires the head record's entries that no later insert refreshed,
// deepest first: a suffix of its path, up to the first refreshed block. With target ≥ 0 it stops once a.n ≤ target, keeping the
// record's shallower rest queued.
func (a *Approx) popRec(target int) {
	r := &a.q[a.head]
	aw := r.w
	a.rm = a.rm[:0]
	j := r.n
	warm := j // the stamps of blocks warm.. are touched
	var touch kv.SeqHash
	for j > 0 && (target < 0 || a.n > target) {
		j--
		if j < warm {
			warm = max(j+1-popWarm, 0)
			for _, s := range a.qseq[r.off+warm : r.off+j+1] {
				touch += aw.last.Touch(s)
			}
		}
		s := a.qseq[r.off+j]
		if stamp, _ := aw.last.Get(s); aw.gone || stamp != r.stamp {
			// Refreshed later, or the worker was removed. A refreshed
			// block's ancestors were refreshed with it (an insert stamps
			// its whole path), so the rest of the record is too: stop.
			j = 0
			break
		}
		aw.last.Delete(s)
		a.n--
		a.rm = append(a.rm, kv.EngineHash(s))
	}
	a.touched += touch
	if len(a.rm) > 0 {
		a.ix.Apply(kv.Removed(aw.key, kv.TierDevice, a.rm))
	}
	if j > 0 {
		r.n = j
		return
	}
	*r = approxRec{}
	a.head++
}

// compact reclaims the popped records' queue space.
func (a *Approx) compact() {
	switch {
	case a.head == len(a.q):
		a.q, a.qseq, a.head = a.q[:0], a.qseq[:0], 0
	case a.head >= 1024 && a.head*2 >= len(a.q):
		base := a.q[a.head].off
		n := copy(a.qseq, a.qseq[base:])
		a.qseq = a.qseq[:n]
		k := copy(a.q, a.q[a.head:])
		clear(a.q[k:])
		a.q, a.head = a.q[:k], 0
		for i := range a.q {
			a.q[i].off -= base
		}
	}
}

// Len is the number of (worker, block) entries.
func (a *Approx) Len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n
}

// RemoveWorker forgets w.
func (a *Approx) RemoveWorker(w kv.WorkerKey) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if aw := a.workers[w]; aw != nil {
		aw.gone = true
		a.n -= aw.last.Len()
		delete(a.workers, w)
	}
	a.ix.RemoveWorker(w)
}

// FindMatches is Index.FindMatches over the approximate holdings.
func (a *Approx) FindMatches(local []kv.LocalHash, dst []Match) []Match {
	return a.ix.FindMatches(local, dst)
}
