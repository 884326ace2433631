package router

import (
	"slices"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// fakeIndex is a naive reference index: each worker holds a set of
// sequence hashes per tier; Depth[t] counts leading blocks held on tier t
// or faster.
type fakeIndex struct {
	mu   sync.Mutex
	held map[kv.WorkerKey]*[kv.NumTiers]map[kv.SeqHash]bool
}

func newFakeIndex() *fakeIndex {
	return &fakeIndex{held: make(map[kv.WorkerKey]*[kv.NumTiers]map[kv.SeqHash]bool)}
}

// store marks the first n blocks of seq as held by w on tier t.
func (f *fakeIndex) store(w kv.WorkerKey, t kv.Tier, seq []kv.SeqHash) {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := f.held[w]
	if h == nil {
		h = new([kv.NumTiers]map[kv.SeqHash]bool)
		f.held[w] = h
	}
	if h[t] == nil {
		h[t] = make(map[kv.SeqHash]bool)
	}
	for _, s := range seq {
		h[t][s] = true
	}
}

func (f *fakeIndex) FindMatches(local []kv.LocalHash, dst []Match) []Match {
	seq := kv.SeqHashes(nil, local)
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := make([]kv.WorkerKey, 0, len(f.held))
	for k := range f.held {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, cmpKey)
	for _, k := range keys {
		h := f.held[k]
		var m Match
		m.Worker = k
		for t := 0; t < kv.NumTiers; t++ {
			n := 0
			for n < len(seq) {
				ok := false
				for u := 0; u <= t; u++ {
					ok = ok || h[u][seq[n]]
				}
				if !ok {
					break
				}
				n++
			}
			m.Depth[t] = uint32(n)
		}
		if m.Depth[kv.NumTiers-1] > 0 {
			dst = append(dst, m)
		}
	}
	return dst
}

// engHash is the engine hash the fakes say worker w names block seq by:
// its own hash domain, unlike any kvmesh hash.
func engHash(w kv.WorkerKey, seq kv.SeqHash) kv.EngineHash {
	return kv.EngineHash(uint64(seq) ^ (w.Instance<<40 | uint64(w.DPRank)<<32 | 0xE))
}

// engineHashes is w's engine hashes of seq.
func (f *fakeIndex) engineHashes(w kv.WorkerKey, seq []kv.SeqHash) []kv.EngineHash {
	out := make([]kv.EngineHash, len(seq))
	for i, s := range seq {
		out[i] = engHash(w, s)
	}
	return out
}

// EngineHashes implements EngineHasher.
func (f *fakeIndex) EngineHashes(w kv.WorkerKey, local []kv.LocalHash, dst []kv.EngineHash) []kv.EngineHash {
	seq := kv.SeqHashes(nil, local)
	f.mu.Lock()
	defer f.mu.Unlock()
	h := f.held[w]
	for _, s := range seq {
		held := false
		for t := range kv.NumTiers {
			held = held || h != nil && h[t][s]
		}
		if !held {
			break
		}
		dst = append(dst, engHash(w, s))
	}
	return dst
}

// fakeApprox is a naive TTL index with the index.Approx contract: entries
// expire ttl after their last insert; expiry is applied at Insert time.
type fakeApprox struct {
	mu      sync.Mutex
	ttl     time.Duration
	expires map[kv.WorkerKey]map[kv.SeqHash]time.Time
	inserts int
}

func newFakeApprox(ttl time.Duration) ApproxIndex {
	return &fakeApprox{ttl: ttl, expires: make(map[kv.WorkerKey]map[kv.SeqHash]time.Time)}
}

func (a *fakeApprox) Insert(w kv.WorkerKey, local []kv.LocalHash, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.inserts++
	for _, m := range a.expires {
		for h, e := range m {
			if !now.Before(e) {
				delete(m, h)
			}
		}
	}
	m := a.expires[w]
	if m == nil {
		m = make(map[kv.SeqHash]time.Time)
		a.expires[w] = m
	}
	for _, s := range kv.SeqHashes(nil, local) {
		m[s] = now.Add(a.ttl)
	}
}

func (a *fakeApprox) FindMatches(local []kv.LocalHash, dst []Match) []Match {
	seq := kv.SeqHashes(nil, local)
	a.mu.Lock()
	defer a.mu.Unlock()
	keys := make([]kv.WorkerKey, 0, len(a.expires))
	for k := range a.expires {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, cmpKey)
	for _, k := range keys {
		n := 0
		for n < len(seq) {
			if _, ok := a.expires[k][seq[n]]; !ok {
				break
			}
			n++
		}
		if n > 0 {
			var m Match
			m.Worker = k
			for t := range m.Depth {
				m.Depth[t] = uint32(n)
			}
			dst = append(dst, m)
		}
	}
	return dst
}

// fakeClock is an injectable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_800_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
