package index

import (
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
