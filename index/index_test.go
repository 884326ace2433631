package index

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/index/ref"
	"github.com/kvmesh/kvmesh/kv"
)

// gen produces random, frequently hostile event streams.
type gen struct {
	r       *rand.Rand
	workers []kv.WorkerKey
	known   map[kv.WorkerKey][]kv.EngineHash // engine hashes a worker stored
	alpha   []kv.LocalHash
}

func newGen(seed uint64, nWorkers int) *gen {
	g := &gen{r: rand.New(rand.NewPCG(seed, seed^0xabc)), known: map[kv.WorkerKey][]kv.EngineHash{}}
	for i := 0; i < nWorkers; i++ {
		g.workers = append(g.workers, kv.WorkerKey{Instance: uint64(g.r.IntN(nWorkers/2 + 1)), DPRank: uint32(i)})
	}
	g.alpha = []kv.LocalHash{0, 1, 2, math.MaxUint64, kv.LocalHash(g.r.Uint64()), kv.LocalHash(g.r.Uint64())}
	return g
}

func (g *gen) local() kv.LocalHash { return g.alpha[g.r.IntN(len(g.alpha))] }

func (g *gen) event() kv.Event {
	w := g.workers[g.r.IntN(len(g.workers))]
	tier := kv.Tier(g.r.IntN(kv.NumTiers))
	switch x := g.r.IntN(100); {
	case x < 60:
		var parent *kv.EngineHash
		var pe kv.EngineHash
		kn := g.known[w]
		switch y := g.r.IntN(100); {
		case y < 70 && len(kn) > 0:
			pe = kn[g.r.IntN(len(kn))]
			parent = &pe
		case y < 75:
			pe = kv.EngineHash(g.r.Uint64()) // almost surely unknown
			parent = &pe
		}
		n := 1 + g.r.IntN(4)
		blocks := make([]kv.StoredBlock, n)
		prev := pe
		for i := range blocks {
			l := g.local()
			e := kv.EngineHash(kv.ChainHash(kv.SeqHash(prev), l)) // canonical: equal for equal paths
			switch z := g.r.IntN(100); {
			case z < 8:
				e ^= kv.EngineHash(w.Instance<<32 | uint64(w.DPRank) + 1) // worker-specific
			case z < 14:
				e = kv.EngineHash(g.r.IntN(4)) // collisions across nodes
			case z < 16:
				e = math.MaxUint64
			}
			blocks[i] = kv.StoredBlock{EngineHash: e, LocalHash: l}
			g.known[w] = append(g.known[w], e)
			prev = e
		}
		if len(g.known[w]) > 64 {
			g.known[w] = g.known[w][len(g.known[w])-64:]
		}
		return kv.Stored(w, tier, parent, blocks)
	case x < 92:
		var hs []kv.EngineHash
		for i := 1 + g.r.IntN(3); i > 0; i-- {
			if kn := g.known[w]; len(kn) > 0 && g.r.IntN(10) < 8 {
				hs = append(hs, kn[g.r.IntN(len(kn))])
			} else {
				hs = append(hs, kv.EngineHash(g.r.IntN(6)))
			}
		}
		return kv.Removed(w, tier, hs)
	case x < 95:
		return kv.Cleared(w)
	case x < 97:
		return kv.Event{Worker: w, Tier: kv.Tier(4 + g.r.IntN(200)), Kind: kv.EventStored, Blocks: []kv.StoredBlock{{EngineHash: 1, LocalHash: 1}}}
	default:
		return kv.Event{Worker: w, Kind: kv.EventKind(g.r.IntN(2) * 9)}
	}
}

func (g *gen) query() []kv.LocalHash {
	q := make([]kv.LocalHash, 1+g.r.IntN(7))
	for i := range q {
		q[i] = g.local()
	}
	return q
}

func convert(ms []Match) []ref.Match {
	out := make([]ref.Match, len(ms))
	for i, m := range ms {
		out[i] = ref.Match(m)
	}
	return out
}

// underTest is what compareAll checks against the model: an Index or a
// Sharded.
type underTest interface {
	FindMatches([]kv.LocalHash, []Match) []Match
	BlockCounts(kv.WorkerKey) [kv.NumTiers]int
	Stats() Stats
}

func compareAll(t *testing.T, ix underTest, rf *ref.Index, g *gen, step int) {
	t.Helper()
	for q := 0; q < 40; q++ {
		query := g.query()
		got := convert(ix.FindMatches(query, nil))
		want := rf.FindMatches(query, nil)
		if len(got) == 0 && len(want) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d query %v:\n got  %v\n want %v", step, query, got, want)
		}
	}
	for _, w := range g.workers {
		if got, want := ix.BlockCounts(w), rf.BlockCounts(w); got != want {
			t.Fatalf("step %d worker %v counts %v want %v", step, w, got, want)
		}
	}
	s, rs := ix.Stats(), rf.Stats()
	gs := ref.Stats{Events: s.Events, Blocks: s.Blocks, ParentNotFound: s.ParentNotFound, DuplicateStore: s.DuplicateStore,
		RemoveUnknown: s.RemoveUnknown, Rebound: s.Rebound, BadTier: s.BadTier, BadKind: s.BadKind, UnknownWorkerCleared: s.UnknownWorkerCleared}
	if gs != rs {
		t.Fatalf("step %d stats\n got  %+v\n want %+v", step, gs, rs)
	}
}

func TestMatchesReferenceOnRandomStreams(t *testing.T) {
	for _, nw := range []int{1, 3, 9, 70, 150} {
		for seed := uint64(1); seed <= 4; seed++ {
			t.Run(fmt.Sprintf("w%d/s%d", nw, seed), func(t *testing.T) {
				g := newGen(seed*1000+uint64(nw), nw)
				ix, rf := New(), ref.New()
				steps := 3000
				if testing.Short() {
					steps = 600
				}
				for i := 0; i < steps; i++ {
					ev := g.event()
					if g.r.IntN(400) == 0 {
						w := g.workers[g.r.IntN(len(g.workers))]
						ix.RemoveWorker(w)
						rf.RemoveWorker(w)
						delete(g.known, w)
						continue
					}
					ix.Apply(ev)
					rf.Apply(ev)
					if i%25 == 0 {
						compareAll(t, ix, rf, g, i)
					}
				}
				compareAll(t, ix, rf, g, steps)
				checkDumps(t, ix, rf)
				checkEngineHashes(t, ix, rf)
				// Removing every worker frees every node.
				for _, w := range ix.Workers() {
					ix.RemoveWorker(w)
				}
				if s := ix.Stats(); s.Nodes != 0 || s.Holdings != 0 || s.Overflow != 0 || s.HolderSets != 0 {
					t.Fatalf("after removing all workers: %+v", s)
				}
			})
		}
	}
}

// Sharded is the model too: the same hostile streams over three shards,
// worker removals included; its worker list is every shard's, in order.
func TestShardedMatchesReferenceOnRandomStreams(t *testing.T) {
	for _, nw := range []int{3, 70} {
		for seed := uint64(1); seed <= 2; seed++ {
			t.Run(fmt.Sprintf("w%d/s%d", nw, seed), func(t *testing.T) {
				g := newGen(seed*1000+uint64(nw), nw)
				ix, rf := NewSharded(3, Config{}), ref.New()
				for i := 0; i < 1500; i++ {
					ev := g.event()
					if g.r.IntN(400) == 0 {
						w := g.workers[g.r.IntN(len(g.workers))]
						ix.RemoveWorker(w)
						rf.RemoveWorker(w)
						continue
					}
					ix.Apply(ev)
					rf.Apply(ev)
					if i%50 == 0 {
						compareAll(t, ix, rf, g, i)
					}
				}
				compareAll(t, ix, rf, g, 1500)
				if got, want := ix.Workers(), rf.Workers(); !reflect.DeepEqual(got, want) {
					t.Fatalf("workers %v, want %v", got, want)
				}
				if nw > 3 && ix.Stats().Holdings == ix.shards[0].Stats().Holdings {
					t.Fatal("every holding landed in one shard")
				}
			})
		}
	}
}

// ApplyBatch is Apply per event: random streams in random-sized batches
// (bad events included) leave what the reference has after each event.
func TestApplyBatchMatchesReference(t *testing.T) {
	for _, nw := range []int{1, 9, 150} {
		g := newGen(uint64(nw)+77, nw)
		ix, rf := New(), ref.New()
		var batch []kv.Event
		for i := 0; i < 2000; i++ {
			ev := g.event()
			if i%97 == 5 {
				ev.Tier = kv.Tier(9) // dropped, and counted, in its place
			}
			batch = append(batch, ev)
			rf.Apply(ev)
			if g.r.IntN(8) == 0 {
				ix.ApplyBatch(batch)
				batch = batch[:0]
				compareAll(t, ix, rf, g, i)
			}
		}
		ix.ApplyBatch(batch)
		ix.ApplyBatch(nil)
		compareAll(t, ix, rf, g, 2000)
		checkDumps(t, ix, rf)
		if s := ix.Stats(); s.BadTier == 0 || s.Events != rf.Stats().Events {
			t.Fatalf("w%d: stats %+v, reference %+v", nw, s, rf.Stats())
		}
	}
}

// checkDumps rebuilds every worker from its dump, in a fresh reference and a
// fresh index, and requires identical holdings.
func checkDumps(t *testing.T, ix *Index, rf *ref.Index) {
	t.Helper()
	fresh, freshIx := ref.New(), New()
	for _, w := range rf.Workers() {
		for _, ev := range ix.Dump(w) {
			fresh.Apply(ev)
			freshIx.Apply(ev)
		}
		want := rf.Holdings(w)
		if got := fresh.Holdings(w); !reflect.DeepEqual(got, want) {
			t.Fatalf("worker %v: dump rebuilds\n %v\nwant\n %v", w, got, want)
		}
		if got, want := freshIx.BlockCounts(w), rf.BlockCounts(w); got != want {
			t.Fatalf("worker %v: rebuilt index counts %v want %v", w, got, want)
		}
	}
	if s := fresh.Stats(); s.ParentNotFound+s.Rebound+s.DuplicateStore+s.RemoveUnknown != 0 {
		t.Fatalf("dump replay needed corrections: %+v", s)
	}
}

// checkEngineHashes asks, for every block a worker holds, the engine hashes
// of the path down to it, and requires the reference's: the hash the worker
// stored each block under, up to the first block it does not hold.
func checkEngineHashes(t *testing.T, ix *Index, rf *ref.Index) {
	t.Helper()
	for _, w := range rf.Workers() {
		hs := rf.Holdings(w)
		eng := make(map[string]kv.EngineHash, len(hs))
		for _, h := range hs {
			eng[fmt.Sprint(h.Path)] = h.Engine
		}
		for _, h := range hs {
			var want []kv.EngineHash
			for i := 1; i <= len(h.Path); i++ {
				e, ok := eng[fmt.Sprint(h.Path[:i])]
				if !ok {
					break
				}
				want = append(want, e)
			}
			if got := ix.EngineHashes(w, h.Path, nil); !reflect.DeepEqual(got, want) {
				t.Fatalf("worker %v path %v: engine hashes %v, want %v", w, h.Path, got, want)
			}
		}
	}
	if got := ix.EngineHashes(kv.WorkerKey{Instance: 1 << 60}, []kv.LocalHash{0, 1}, nil); len(got) != 0 {
		t.Fatalf("unknown worker: %v", got)
	}
}

func TestDepthSemantics(t *testing.T) {
	ix := New()
	a, b := kv.WorkerKey{Instance: 2}, kv.WorkerKey{Instance: 1, DPRank: 3}
	p := func(x kv.EngineHash) *kv.EngineHash { return &x }
	// a: blocks 10,11,12 on device; 13 on disk. b: 10 on host, 11 on device.
	ix.Apply(kv.Stored(a, kv.TierDevice, nil, []kv.StoredBlock{{EngineHash: 100, LocalHash: 10}, {EngineHash: 101, LocalHash: 11}, {EngineHash: 102, LocalHash: 12}}))
	ix.Apply(kv.Stored(a, kv.TierDisk, p(102), []kv.StoredBlock{{EngineHash: 103, LocalHash: 13}}))
	ix.Apply(kv.Stored(b, kv.TierHost, nil, []kv.StoredBlock{{EngineHash: 100, LocalHash: 10}}))
	ix.Apply(kv.Stored(b, kv.TierDevice, p(100), []kv.StoredBlock{{EngineHash: 101, LocalHash: 11}}))
	got := ix.FindMatches([]kv.LocalHash{10, 11, 12, 13, 14}, nil)
	want := []Match{
		{Worker: b, Depth: [4]uint32{0, 2, 2, 2}},
		{Worker: a, Depth: [4]uint32{3, 3, 4, 4}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v want %v", got, want)
	}
	// Equal blocks at another position are different nodes.
	if m := ix.FindMatches([]kv.LocalHash{11}, nil); len(m) != 0 {
		t.Fatalf("block 11 at the root matched: %v", m)
	}
	ix.Apply(kv.Stored(a, kv.TierDevice, p(999), []kv.StoredBlock{{EngineHash: 5, LocalHash: 5}}))
	ix.Apply(kv.Removed(a, kv.TierDevice, []kv.EngineHash{101}))
	if m := ix.FindMatches([]kv.LocalHash{10, 11, 12}, nil); m[1].Depth != [4]uint32{1, 1, 1, 1} {
		t.Fatalf("after removing the middle block: %v", m)
	}
	if s := ix.Stats(); s.ParentNotFound != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// TestConcurrentReaders runs lock-free readers against a writer; run with
// -race. Afterwards the index must still equal the reference.
func TestConcurrentReaders(t *testing.T) {
	g := newGen(77, 80)
	evs := make([]kv.Event, 4000)
	for i := range evs {
		evs[i] = g.event()
	}
	queries := make([][]kv.LocalHash, 200)
	for i := range queries {
		queries[i] = g.query()
	}
	ix, rf := New(), ref.New()
	done := make(chan struct{})
	var wg sync.WaitGroup
	for r := 0; r < 3; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var dst []Match
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				dst = ix.FindMatches(queries[i%len(queries)], dst[:0])
				for j := 1; j < len(dst); j++ {
					if !less(dst[j-1].Worker, dst[j].Worker) {
						t.Errorf("unordered result %v", dst)
						return
					}
				}
			}
		}()
	}
	for _, ev := range evs {
		ix.Apply(ev)
		rf.Apply(ev)
	}
	close(done)
	wg.Wait()
	compareAll(t, ix, rf, g, len(evs))
}

func TestHostileInputNeverPanics(t *testing.T) {
	ix := New()
	w := kv.WorkerKey{Instance: math.MaxUint64, DPRank: math.MaxUint32}
	for _, h := range []kv.EngineHash{0, 1, math.MaxUint64, 0xFFFFFFFF} {
		ix.Apply(kv.Stored(w, kv.TierDevice, nil, []kv.StoredBlock{{EngineHash: h, LocalHash: kv.LocalHash(h)}, {EngineHash: h, LocalHash: kv.LocalHash(h)}}))
		ix.Apply(kv.Stored(w, kv.TierDevice, &h, []kv.StoredBlock{{EngineHash: h, LocalHash: kv.LocalHash(h)}}))
		ix.Apply(kv.Removed(w, kv.TierDevice, []kv.EngineHash{h, h}))
	}
	ix.Apply(kv.Removed(kv.WorkerKey{Instance: 9}, kv.TierDevice, []kv.EngineHash{1}))
	ix.Apply(kv.Cleared(kv.WorkerKey{Instance: 9}))
	ix.Apply(kv.Event{Kind: kv.EventStored, Tier: 200})
	ix.Apply(kv.Event{Kind: 0})
	ix.FindMatches(nil, nil)
	ix.FindMatches([]kv.LocalHash{math.MaxUint64, 0}, nil)
	s := ix.Stats()
	if s.RemoveUnknown == 0 || s.UnknownWorkerCleared != 1 || s.BadTier != 1 || s.BadKind != 1 || s.Rebound == 0 {
		t.Fatalf("stats %+v", s)
	}
}

// Sharded merges wide answers (many workers holding a shared prefix, to
// different depths and on different tiers): as workers join, leave and
// rejoin in reused slots of several shards, its answers stay those of one
// Index fed the same events, which the reference model proves elsewhere.
func TestShardedWideAnswersMatchOneIndex(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	sh, one := NewSharded(3, Config{}), New()
	prefix := make([]kv.StoredBlock, 12)
	query := make([]kv.LocalHash, 16)
	for i := range prefix {
		prefix[i] = kv.StoredBlock{EngineHash: kv.EngineHash(1000 + i), LocalHash: kv.LocalHash(5000 + i)}
		query[i] = prefix[i].LocalHash
	}
	for i := len(prefix); i < len(query); i++ {
		query[i] = kv.LocalHash(r.Uint64())
	}
	var live []kv.WorkerKey
	wide, placed := 0, 0
	for step := 0; step < 600; step++ {
		switch {
		case len(live) > 0 && r.IntN(5) == 0:
			k := r.IntN(len(live))
			sh.RemoveWorker(live[k])
			one.RemoveWorker(live[k])
			live = slices.Delete(live, k, k+1)
		default:
			w := kv.WorkerKey{Instance: r.Uint64N(400), DPRank: uint32(r.IntN(3))}
			// Each stores a part of the prefix on a tier of its own, so
			// the workers drop out at different depths and tiers.
			ev := kv.Stored(w, kv.Tier(r.IntN(kv.NumTiers)), nil, prefix[:1+r.IntN(len(prefix))])
			if r.IntN(300) == 0 {
				// Now and then one holding none of it: the answer
				// leaves a live worker out and the shards' answers merge.
				h := r.Uint64()
				ev = kv.Stored(w, kv.TierDevice, nil, []kv.StoredBlock{{EngineHash: kv.EngineHash(h), LocalHash: kv.LocalHash(h)}})
			}
			sh.Apply(ev)
			one.Apply(ev)
			if !slices.Contains(live, w) {
				live = append(live, w)
			}
		}
		got, want := sh.FindMatches(query, nil), one.FindMatches(query, nil)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d: sharded %v\n want %v", step, got, want)
		}
		if len(got) >= 64 {
			wide++
		}
		// The placement the find left (it ranks a stale one) is the one computed
		// from scratch for the shards' views.
		p := sh.place.Load()
		if p.stale {
			t.Fatalf("step %d: a find left the placement stale", step)
		}
		fresh := &placement{views: p.views, pos: make([][]uint32, len(p.pos))}
		fresh.placeAll()
		if p.n != fresh.n {
			t.Fatalf("step %d: placement of %d workers, from scratch %d", step, p.n, fresh.n)
		}
		for k, v := range p.views {
			for _, sl := range v.slotOf { // other slots' entries are stale
				if p.pos[k][sl] != fresh.pos[k][sl] {
					t.Fatalf("step %d: shard %d slot %d at %d, from scratch %d", step, k, sl, p.pos[k][sl], fresh.pos[k][sl])
				}
			}
		}
		for k := range sh.shards {
			if p.views[k] != sh.shards[k].vw.Load() {
				t.Fatalf("step %d: shard %d's placement is for an older view", step, k)
			}
		}
		if placedAll(sh, query) {
			placed++
		}
	}
	if wide < 100 {
		t.Fatalf("only %d answers of 64 workers or more: the test is not about wide answers", wide)
	}
	// Both paths ran: answers written into place, and merged ones (a
	// worker holding nothing of the query's start, or a shard empty).
	if placed < 100 || placed > 550 {
		t.Fatalf("%d of 600 answers written into place", placed)
	}
}

// placedAll reports whether every shard of sh would write its answer to
// query into place (FindMatches' placed path).
func placedAll(sh *Sharded, query []kv.LocalHash) bool {
	p := sh.place.Load()
	sp := scatter{out: make([]Match, p.n)}
	for k, x := range sh.shards {
		sp.v, sp.pos = p.views[k], p.pos[k]
		if !x.findScatter(query, &sp) {
			return false
		}
	}
	return true
}
