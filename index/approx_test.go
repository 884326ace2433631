package index

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

func TestApproxTTLAndRefresh(t *testing.T) {
	a := NewApprox(10*time.Second, 0)
	w1, w2 := kv.WorkerKey{Instance: 1}, kv.WorkerKey{Instance: 2}
	t0 := time.Unix(1000, 0)
	a.Insert(w1, []kv.LocalHash{1, 2, 3}, t0)
	a.Insert(w2, []kv.LocalHash{1, 2}, t0.Add(5*time.Second))
	m := a.FindMatches([]kv.LocalHash{1, 2, 3, 4}, nil)
	if len(m) != 2 || m[0].Depth != [4]uint32{3, 3, 3, 3} || m[1].Depth != [4]uint32{2, 2, 2, 2} {
		t.Fatalf("matches %v", m)
	}
	// w1 refreshes only its first block at t0+8s.
	a.Insert(w1, []kv.LocalHash{1}, t0.Add(8*time.Second))
	a.Expire(t0.Add(11 * time.Second))
	m = a.FindMatches([]kv.LocalHash{1, 2, 3}, nil)
	if len(m) != 2 || m[0].Depth[0] != 1 || m[1].Depth[0] != 2 {
		t.Fatalf("after expiry %v", m)
	}
	a.Expire(t0.Add(20 * time.Second))
	if m = a.FindMatches([]kv.LocalHash{1}, nil); len(m) != 0 || a.Len() != 0 {
		t.Fatalf("all expired: %v, %d entries", m, a.Len())
	}
	if s := a.ix.Stats(); s.Nodes != 0 {
		t.Fatalf("nodes left: %+v", s)
	}
}

func TestApproxCapacityPrunesLeavesFirst(t *testing.T) {
	a := NewApprox(time.Minute, 10)
	w := kv.WorkerKey{Instance: 7}
	t0 := time.Unix(0, 0)
	a.Insert(w, []kv.LocalHash{1, 2, 3, 4, 5, 6, 7, 8}, t0)
	a.Insert(w, []kv.LocalHash{1, 2, 3, 4, 9, 10}, t0.Add(time.Second))
	// 10 distinct entries fit; one more forces a prune to 8, oldest and
	// deepest first: the tail of the first path goes.
	a.Insert(w, []kv.LocalHash{1, 2, 3, 4, 9, 10, 11}, t0.Add(2*time.Second))
	if a.Len() != 8 {
		t.Fatalf("len %d, want 8", a.Len())
	}
	if m := a.FindMatches([]kv.LocalHash{1, 2, 3, 4, 9, 10, 11}, nil); m[0].Depth[0] != 7 {
		t.Fatalf("fresh path lost: %v", m)
	}
	if m := a.FindMatches([]kv.LocalHash{1, 2, 3, 4, 5, 6, 7, 8}, nil); m[0].Depth[0] != 5 {
		t.Fatalf("old path should keep its prefix plus block 5: %v", m)
	}
}

// TestApproxMatchesNaive replays random inserts and expiries against a
// naive model (each (worker, block) expires TTL after its last insert) and
// compares every worker's depth; enough traffic to recycle the queue.
func TestApproxMatchesNaive(t *testing.T) {
	const ttl = 10 * time.Second
	a := NewApprox(ttl, 0)
	rng := rand.New(rand.NewPCG(3, 4))
	type key struct {
		w   kv.WorkerKey
		seq kv.SeqHash
	}
	model := map[key]time.Time{}
	now := time.Unix(0, 0)
	paths := make([][]kv.LocalHash, 40)
	for i := range paths {
		paths[i] = make([]kv.LocalHash, 1+rng.IntN(12))
		for j := range paths[i] {
			paths[i][j] = kv.LocalHash(rng.Uint64N(6)) // shared prefixes
		}
	}
	for step := 0; step < 20000; step++ {
		now = now.Add(time.Duration(rng.Int64N(int64(400 * time.Millisecond))))
		w := kv.WorkerKey{Instance: uint64(1 + rng.IntN(4))}
		p := paths[rng.IntN(len(paths))]
		p = p[:1+rng.IntN(len(p))]
		if rng.IntN(10) == 0 {
			a.Expire(now)
		} else {
			if step%2 == 0 {
				a.Insert(w, p, now)
			} else {
				a.InsertSeq(w, p, kv.SeqHashes(nil, p), now) // the router's way
			}
			for _, s := range kv.SeqHashes(nil, p) {
				model[key{w, s}] = now.Add(ttl)
			}
		}
		for k, exp := range model {
			if !exp.After(now) {
				delete(model, k)
			}
		}
		if a.Len() != len(model) {
			t.Fatalf("step %d: %d entries, model %d", step, a.Len(), len(model))
		}
		q := paths[rng.IntN(len(paths))]
		seq := kv.SeqHashes(nil, q)
		got := a.FindMatches(q, nil)
		for wi := uint64(1); wi <= 4; wi++ {
			w := kv.WorkerKey{Instance: wi}
			want := 0
			for want < len(seq) {
				if _, ok := model[key{w, seq[want]}]; !ok {
					break
				}
				want++
			}
			var d uint32
			for _, m := range got {
				if m.Worker == w {
					d = m.Depth[0]
				}
			}
			if int(d) != want {
				t.Fatalf("step %d: worker %d depth %d, model %d", step, wi, d, want)
			}
		}
	}
}

// A clock that goes back never expires an entry before a later one: the
// expiry is clamped to the latest queued.
func TestApproxClockBackwards(t *testing.T) {
	a := NewApprox(10*time.Second, 0)
	w := kv.WorkerKey{Instance: 1}
	t0 := time.Unix(100, 0)
	a.Insert(w, []kv.LocalHash{1, 2}, t0)
	a.Insert(w, []kv.LocalHash{3}, t0.Add(-5*time.Second)) // would expire at t0+5s
	a.Expire(t0.Add(6 * time.Second))
	if a.Len() != 3 {
		t.Fatalf("%d entries at t0+6s, want 3 (expiry clamped to t0+10s)", a.Len())
	}
	a.Expire(t0.Add(10 * time.Second))
	if a.Len() != 0 {
		t.Fatalf("%d entries at t0+10s", a.Len())
	}
}

// RemoveWorker forgets a worker's entries; its queued inserts are void, and
// a worker re-added under the same key starts afresh.
func TestApproxRemoveWorker(t *testing.T) {
	a := NewApprox(10*time.Second, 0)
	w1, w2 := kv.WorkerKey{Instance: 1}, kv.WorkerKey{Instance: 2}
	t0 := time.Unix(0, 0)
	a.Insert(w1, []kv.LocalHash{1, 2, 3}, t0)
	a.Insert(w2, []kv.LocalHash{1, 2}, t0)
	a.RemoveWorker(w1)
	if a.Len() != 2 {
		t.Fatalf("%d entries after removing w1", a.Len())
	}
	a.Insert(w1, []kv.LocalHash{1}, t0.Add(5*time.Second))
	m := a.FindMatches([]kv.LocalHash{1, 2, 3}, nil)
	if len(m) != 2 || m[0].Worker != w1 || m[0].Depth[0] != 1 || m[1].Depth[0] != 2 {
		t.Fatalf("matches %v", m)
	}
	a.Expire(t0.Add(10 * time.Second)) // the void record of the old w1 must not touch the new one
	if m := a.FindMatches([]kv.LocalHash{1}, nil); len(m) != 1 || m[0].Worker != w1 || a.Len() != 1 {
		t.Fatalf("after the first expiry: %v, %d entries", m, a.Len())
	}
	a.Expire(t0.Add(15 * time.Second))
	if a.Len() != 0 || a.ix.Stats().Nodes != 0 {
		t.Fatalf("%d entries, %+v", a.Len(), a.ix.Stats())
	}
}
