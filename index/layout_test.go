package index

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/index/ref"
	"github.com/kvmesh/kvmesh/kv"
)

// convGen produces conversation-shaped streams: long shared chains stored
// by many workers (so successor runs, shared holder sets and dense/sparse
// switches all occur), LRU-like tail evictions, holes in the middle of
// chains, other tiers, clears and worker removals. Queries walk real chains
// and diverge at random depths.
type convGen struct {
	r       *rand.Rand
	workers []kv.WorkerKey
	convs   [][]kv.LocalHash
	held    map[kv.WorkerKey]map[int]int // worker -> conversation -> stored depth
}

func newConvGen(seed uint64, nWorkers, nConvs, maxLen int) *convGen {
	g := &convGen{r: rand.New(rand.NewPCG(seed, seed*7+1)), held: map[kv.WorkerKey]map[int]int{}}
	for i := 0; i < nWorkers; i++ {
		g.workers = append(g.workers, kv.WorkerKey{Instance: uint64(g.r.IntN(nWorkers)), DPRank: uint32(i)})
	}
	sys := make([]kv.LocalHash, 8) // a system prompt every conversation shares
	for i := range sys {
		sys[i] = kv.LocalHash(g.r.Uint64())
	}
	for c := 0; c < nConvs; c++ {
		n := 1 + g.r.IntN(maxLen)
		conv := make([]kv.LocalHash, n)
		for i := range conv {
			if i < len(sys) && c%4 != 0 {
				conv[i] = sys[i]
			} else {
				conv[i] = kv.LocalHash(g.r.Uint64() & 0xFFFF) // small: equal blocks under different parents
			}
		}
		g.convs = append(g.convs, conv)
	}
	return g
}

// engine hash a worker uses for conversation c's block i: canonical, so
// workers agree, except for a few workers that name blocks their own way.
func (g *convGen) engine(w kv.WorkerKey, c, i int) kv.EngineHash {
	e := kv.EngineHash(kv.SeqHashes(nil, g.convs[c][:i+1])[i])
	if w.DPRank%17 == 5 {
		e ^= kv.EngineHash(w.DPRank) << 40
	}
	return e
}

func (g *convGen) event() (kv.Event, bool) {
	w := g.workers[g.r.IntN(len(g.workers))]
	hm := g.held[w]
	if hm == nil {
		hm = map[int]int{}
		g.held[w] = hm
	}
	switch x := g.r.IntN(100); {
	case x < 55: // store a turn: extend a conversation from what w holds
		c := g.r.IntN(len(g.convs))
		from := hm[c]
		if g.r.IntN(5) == 0 {
			from = 0 // or store from the root again
		}
		conv := g.convs[c]
		if from >= len(conv) {
			return kv.Event{}, false
		}
		to := from + 1 + g.r.IntN(len(conv)-from)
		blocks := make([]kv.StoredBlock, 0, to-from)
		for i := from; i < to; i++ {
			blocks = append(blocks, kv.StoredBlock{EngineHash: g.engine(w, c, i), LocalHash: conv[i]})
		}
		var parent *kv.EngineHash
		if from > 0 {
			p := g.engine(w, c, from-1)
			parent = &p
		}
		tier := kv.TierDevice
		if g.r.IntN(6) == 0 {
			tier = kv.Tier(g.r.IntN(kv.NumTiers))
		}
		if to > hm[c] {
			hm[c] = to
		}
		return kv.Stored(w, tier, parent, blocks), true
	case x < 85: // evict a tail (leaf first), sometimes a hole in the middle
		for c, d := range hm {
			if d == 0 {
				continue
			}
			n := 1 + g.r.IntN(d)
			var hs []kv.EngineHash
			for i := d - 1; i >= d-n; i-- {
				hs = append(hs, g.engine(w, c, i))
			}
			if g.r.IntN(4) == 0 {
				hs = []kv.EngineHash{g.engine(w, c, g.r.IntN(d))}
			} else {
				hm[c] = d - n
			}
			tier := kv.TierDevice
			if g.r.IntN(6) == 0 {
				tier = kv.Tier(g.r.IntN(kv.NumTiers))
			}
			return kv.Removed(w, tier, hs), true
		}
		return kv.Event{}, false
	case x < 87:
		delete(g.held, w)
		return kv.Cleared(w), true
	default:
		return kv.Event{}, false
	}
}

func (g *convGen) query() []kv.LocalHash {
	conv := g.convs[g.r.IntN(len(g.convs))]
	q := append([]kv.LocalHash(nil), conv[:1+g.r.IntN(len(conv))]...)
	if g.r.IntN(3) == 0 {
		q[g.r.IntN(len(q))] ^= 1 // diverge
	}
	return q
}

func compareConv(t *testing.T, ix *Index, rf *ref.Index, g *convGen, step int) {
	t.Helper()
	for q := 0; q < 30; q++ {
		query := g.query()
		got, want := convert(ix.FindMatches(query, nil)), rf.FindMatches(query, nil)
		if len(got) == 0 && len(want) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d query of %d blocks:\n got  %v\n want %v", step, len(query), got, want)
		}
	}
	for _, w := range g.workers {
		if got, want := ix.BlockCounts(w), rf.BlockCounts(w); got != want {
			t.Fatalf("step %d worker %v counts %v want %v", step, w, got, want)
		}
	}
}

// checkInternals verifies the layout invariants: every live node that is
// not its parent's successor has a child-table slot (and no other does),
// the engine table holds exactly the nodes with a shared hash, holder-set
// references add up, and freed ids are all reachable for reuse.
func checkInternals(t *testing.T, ix *Index) {
	t.Helper()
	ix.mu.Lock()
	defer ix.mu.Unlock()
	d := *ix.dir.Load()
	inTab, eng, free := 0, 0, 0
	refs := map[uint32]int{}
	kids := map[uint32]int{}
	for id := uint32(1); id < ix.next; id++ {
		n := nodeAt(d, id)
		p := parentOf(n.pg.Load())
		if p == noParent {
			free++
			continue
		}
		if inTable(id, p) {
			inTab++
		}
		if p != 0 {
			kids[p]++
		}
		if got, _, _, _, _, _ := ix.lookup(ix.ctab.Load(), d, p, n.local.Load()); got != id {
			t.Fatalf("node %d (parent %d) is not found by lookup: %d", id, p, got)
		}
		if ix.chunkOf(id).nc[id&chunkMask]&hasEngBit != 0 {
			eng++
			if x, _ := ix.etabFind(ix.chunkOf(id).eng[id&chunkMask]); x != id {
				t.Fatalf("node %d: engine table gives %d", id, x)
			}
		}
		if h := n.holders.Load(); h&ovfFlag != 0 {
			hs := ix.setOf(h)
			if hs == nil || len(hs.ent) <= 2 {
				t.Fatalf("node %d: bad holder set %v", id, hs)
			}
			refs[hs.idx]++
		}
	}
	for id := uint32(1); id < ix.next; id++ {
		if parentOf(nodeAt(d, id).pg.Load()) != noParent && ix.childCount(id) != kids[id] {
			t.Fatalf("node %d: %d children counted, %d live", id, ix.childCount(id), kids[id])
		}
	}
	if len(ix.bigKids) != 0 && ix.bigKids[0] != 0 {
		t.Fatalf("the root's children are counted in bigKids")
	}
	if ct := ix.ctab.Load(); ct.used != inTab {
		t.Fatalf("child table holds %d ids, %d nodes need a slot", ct.used, inTab)
	}
	if ix.etab.used != eng {
		t.Fatalf("engine table holds %d ids, %d nodes have a shared hash", ix.etab.used, eng)
	}
	if free != ix.nfree {
		t.Fatalf("%d free ids, counted %d", free, ix.nfree)
	}
	if uint64(len(refs)) != ix.st.HolderSets {
		t.Fatalf("%d holder sets in use, stats say %d", len(refs), ix.st.HolderSets)
	}
	for idx, n := range refs {
		if hs := (*ix.ovfDir.Load())[idx>>chunkBits][idx&chunkMask].Load(); hs.refs != n {
			t.Fatalf("set %d: %d refs, %d nodes", idx, hs.refs, n)
		}
	}
}

func TestConversationsMatchReference(t *testing.T) {
	testConversations(t, Config{})
}

// The same with storeFresh binding chains after creating them, as it does
// once the engine table outgrows the cache.
func TestConversationsMatchReferenceBindAfter(t *testing.T) {
	testConversations(t, Config{BindAfterSlots: -1})
}

func testConversations(t *testing.T, cfg Config) {
	for _, c := range []struct{ workers, convs, maxLen int }{{4, 6, 40}, {40, 30, 120}, {300, 60, 160}, {1500, 12, 60}} {
		for seed := uint64(1); seed <= 2; seed++ {
			t.Run(fmt.Sprintf("w%d/s%d", c.workers, seed), func(t *testing.T) {
				g := newConvGen(seed, c.workers, c.convs, c.maxLen)
				ix, rf := NewWith(cfg), ref.New()
				steps := 2500
				if testing.Short() {
					steps = 800
				}
				for i := 0; i < steps; i++ {
					if g.r.IntN(300) == 0 {
						w := g.workers[g.r.IntN(len(g.workers))]
						ix.RemoveWorker(w)
						rf.RemoveWorker(w)
						delete(g.held, w)
						continue
					}
					ev, ok := g.event()
					if !ok {
						continue
					}
					ix.Apply(ev)
					rf.Apply(ev)
					if i%50 == 0 {
						compareConv(t, ix, rf, g, i)
					}
					if i%500 == 0 {
						checkInternals(t, ix)
					}
				}
				compareConv(t, ix, rf, g, steps)
				checkInternals(t, ix)
				checkDumps(t, ix, rf)
				s, rs := ix.Stats(), rf.Stats()
				if s.Rebound != rs.Rebound || s.RemoveUnknown != rs.RemoveUnknown || s.ParentNotFound != rs.ParentNotFound || s.DuplicateStore != rs.DuplicateStore {
					t.Fatalf("stats %+v, reference %+v", s, rs)
				}
				high := ix.next
				for _, w := range ix.Workers() {
					ix.RemoveWorker(w)
				}
				if s := ix.Stats(); s.Nodes != 0 || s.Holdings != 0 || s.Overflow != 0 || s.HolderSets != 0 {
					t.Fatalf("after removing all workers: %+v", s)
				}
				checkInternals(t, ix)
				// Freed ids are reused: replaying a similar load does not
				// grow the id space much beyond its high-water mark.
				g2 := newConvGen(seed+100, c.workers, c.convs, c.maxLen)
				for i := 0; i < steps; i++ {
					if ev, ok := g2.event(); ok {
						ix.Apply(ev)
					}
				}
				checkInternals(t, ix)
				if ix.next > 2*high+chunkSize {
					t.Fatalf("id space grew from %d to %d though all ids were free", high, ix.next)
				}
			})
		}
	}
}

func TestSharedHolderSets(t *testing.T) {
	ix := New()
	chain := make([]kv.StoredBlock, 100)
	for i := range chain {
		chain[i] = kv.StoredBlock{EngineHash: kv.EngineHash(1000 + i), LocalHash: kv.LocalHash(i)}
	}
	ws := []kv.WorkerKey{{Instance: 3}, {Instance: 1}, {Instance: 2}, {Instance: 5}}
	for _, w := range ws {
		ix.Apply(kv.Stored(w, kv.TierDevice, nil, chain))
	}
	if s := ix.Stats(); s.Nodes != 100 || s.Overflow != 100 || s.HolderSets != 1 {
		t.Fatalf("four workers on one chain: %+v", s)
	}
	// The chain is one successor run: no child-table slot past its head.
	if used := ix.ctab.Load().used; used != 0 {
		t.Fatalf("child table holds %d ids for one chain (the head is the root's successor)", used)
	}
	// Evict the last 30 blocks of one worker: the tail gets a second set.
	var tail []kv.EngineHash
	for i := 99; i >= 70; i-- {
		tail = append(tail, kv.EngineHash(1000+i))
	}
	ix.Apply(kv.Removed(ws[0], kv.TierDevice, tail))
	if s := ix.Stats(); s.HolderSets != 2 || s.Overflow != 100 {
		t.Fatalf("after a tail eviction: %+v", s)
	}
	q := make([]kv.LocalHash, 100)
	for i := range q {
		q[i] = kv.LocalHash(i)
	}
	got := ix.FindMatches(q, nil)
	if len(got) != 4 || got[0].Worker != ws[1] || got[2].Worker != ws[0] || got[2].Depth != [4]uint32{70, 70, 70, 70} || got[3].Depth[0] != 100 {
		t.Fatalf("matches %v", got)
	}
	// Two holders left: the nodes fall back to inline holders.
	ix.RemoveWorker(ws[2])
	ix.RemoveWorker(ws[3])
	if s := ix.Stats(); s.HolderSets != 0 || s.Overflow != 0 || s.Holdings != 170 {
		t.Fatalf("two workers left: %+v", s)
	}
	checkInternals(t, ix)
}

// TestConcurrentReadersConversations runs lock-free readers against a
// writer that recycles nodes and holder sets; run with -race.
func TestConcurrentReadersConversations(t *testing.T) {
	g := newConvGen(9, 60, 20, 200)
	var evs []kv.Event
	for len(evs) < 3000 {
		if ev, ok := g.event(); ok {
			evs = append(evs, ev)
		}
	}
	queries := make([][]kv.LocalHash, 100)
	for i := range queries {
		queries[i] = g.query()
	}
	ix, rf := New(), ref.New()
	done := make(chan struct{})
	var wg sync.WaitGroup
	for r := 0; r < 2; r++ {
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
				q := queries[i%len(queries)]
				dst = ix.FindMatches(q, dst[:0])
				for j, m := range dst {
					if j > 0 && !less(dst[j-1].Worker, m.Worker) {
						t.Errorf("unordered result %v", dst)
						return
					}
					for k := 1; k < kv.NumTiers; k++ {
						if m.Depth[k] < m.Depth[k-1] || int(m.Depth[k]) > len(q) || m.Depth[kv.NumTiers-1] == 0 {
							t.Errorf("bad depths %v for a %d-block query", m, len(q))
							return
						}
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
	compareConv(t, ix, rf, g, len(evs))
	checkInternals(t, ix)
}

// TestThinHolderSets: a few holders far apart among many workers keep no
// per-tier bitsets (they would cost 32 bytes per 64 slots spanned); readers
// expand them. Checked against the reference, with several tiers.
func TestThinHolderSets(t *testing.T) {
	ix, rf := New(), ref.New()
	apply := func(ev kv.Event) { ix.Apply(ev); rf.Apply(ev) }
	var ws []kv.WorkerKey
	for i := 0; i < 1200; i++ { // give every worker a slot
		w := kv.WorkerKey{Instance: uint64(i * 7 % 1200), DPRank: 1}
		ws = append(ws, w)
		apply(kv.Stored(w, kv.TierDevice, nil, []kv.StoredBlock{{EngineHash: kv.EngineHash(1e9 + i), LocalHash: kv.LocalHash(1e9 + i)}}))
	}
	chain := make([]kv.StoredBlock, 50)
	q := make([]kv.LocalHash, 50)
	for i := range chain {
		chain[i] = kv.StoredBlock{EngineHash: kv.EngineHash(5000 + i), LocalHash: kv.LocalHash(i)}
		q[i] = kv.LocalHash(i)
	}
	holders := []int{3, 400, 799, 1100, 1199}
	for j, x := range holders {
		apply(kv.Stored(ws[x], kv.Tier(j%kv.NumTiers), nil, chain[:50-j*5]))
	}
	p := kv.EngineHash(5000 + 9)
	apply(kv.Stored(ws[1100], kv.TierDevice, &p, chain[10:30]))
	apply(kv.Removed(ws[400], kv.Tier(1), []kv.EngineHash{5000 + 20}))
	ix.mu.Lock()
	thin := 0
	for idx := uint32(1); idx < ix.ovfNext; idx++ {
		if hs := (*ix.ovfDir.Load())[idx>>chunkBits][idx&chunkMask].Load(); hs != nil && hs.cum == nil {
			thin++
		}
	}
	ix.mu.Unlock()
	if thin == 0 {
		t.Fatal("no thin holder set was built")
	}
	for n := 1; n <= len(q); n++ {
		got, want := convert(ix.FindMatches(q[:n], nil)), rf.FindMatches(q[:n], nil)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("query of %d blocks:\n got  %v\n want %v", n, got, want)
		}
	}
	checkInternals(t, ix)
}

// A chain's table entry carries the length of its successor run, which
// FindMatches uses to warm the next turn's lookup.
func TestRunHints(t *testing.T) {
	ix := New()
	w1, w2 := kv.WorkerKey{Instance: 1}, kv.WorkerKey{Instance: 2}
	blocks := func(from, n int) []kv.StoredBlock {
		var b []kv.StoredBlock
		for i := from; i < from+n; i++ {
			b = append(b, kv.StoredBlock{EngineHash: kv.EngineHash(1000 + i), LocalHash: kv.LocalHash(i)})
		}
		return b
	}
	ix.Apply(kv.Stored(w1, kv.TierDevice, nil, blocks(0, 10)))
	// Another chain takes the ids after the first one's end, so the next
	// turn below is not a successor and goes into the table.
	ix.Apply(kv.Stored(w2, kv.TierDevice, nil, blocks(100, 3)))
	p := kv.EngineHash(1009)
	ix.Apply(kv.Stored(w1, kv.TierDevice, &p, blocks(10, 7)))
	d := *ix.dir.Load()
	end := ix.findChild(0, 0) + 9
	id, _, _, _, run, ok := ix.lookup(ix.ctab.Load(), d, end, 10)
	if !ok || id == 0 || id == end+1 || run != 7 {
		t.Fatalf("turn head %d (end %d) run %d, want a table entry with run 7", id, end, run)
	}
	if s, _, _, _, run, _ := ix.lookup(ix.ctab.Load(), d, id, 11); s != id+1 || run != 0 {
		t.Fatalf("successor %d reports run %d, want %d and 0", s, run, id+1)
	}
	q := make([]kv.LocalHash, 17)
	for i := range q {
		q[i] = kv.LocalHash(i)
	}
	if m := ix.FindMatches(q, nil); len(m) != 1 || m[0].Depth[0] != 17 {
		t.Fatalf("matches %+v", m)
	}
	// A later turn leaves the run after its 4th node: the run's hint now
	// points there, where the next lookup of a query of that turn happens.
	p = 1013
	ix.Apply(kv.Stored(w1, kv.TierDevice, &p, blocks(50, 3)))
	if _, _, _, _, run, _ := ix.lookup(ix.ctab.Load(), d, end, 10); run != 4 {
		t.Fatalf("run hint %d after a branch at the 4th node, want 4", run)
	}
	q = append(q[:14], 50, 51, 52)
	if m := ix.FindMatches(q, nil); len(m) != 1 || m[0].Depth[0] != 17 {
		t.Fatalf("matches %+v", m)
	}
}

// warmPath finds every turn head of a conversation through the table's run
// hints alone (the root's run has its hint in rootRun), and a wrong guess
// never changes an answer.
func TestWarmPathTurns(t *testing.T) {
	ix, q := turnsTree()
	if r := ix.rootRun.Load(); r != 8 {
		t.Fatalf("root run hint %d, want 8 (the shared prompt)", r)
	}
	var ah ahead
	ix.warmPath(ix.ctab.Load(), *ix.dir.Load(), kv.RawHashes(q), 1, ix.rootRun.Load(), &ah)
	if ah.n != 16 {
		t.Fatalf("warmPath found %d turn heads, want 16", ah.n)
	}
	parent := uint32(0)
	for i, l := range q {
		id := ix.findChild(parent, uint64(l))
		if i%8 == 0 && i > 0 {
			k := i/8 - 1
			if int(ah.pos[k]) != i || ah.id[k] != id {
				t.Fatalf("turn %d: warmPath expects node %d at %d, the head is %d at %d", k, ah.id[k], ah.pos[k], id, i)
			}
			// A wrong guess falls back to the table.
			got, _, _, ok := ix.childAt(ix.ctab.Load(), *ix.dir.Load(), parent, uint64(l), ah.id[(k+1)%16])
			if !ok || got != id {
				t.Fatalf("childAt with a wrong guess: %d, want %d", got, id)
			}
		}
		parent = id
	}
	m := ix.FindMatches(q, nil)
	if len(m) != 256 {
		t.Fatalf("%d matches", len(m))
	}
	for _, x := range m {
		want := uint32(min(8*(x.Worker.Instance%16+2), 136))
		if x.Depth != [kv.NumTiers]uint32{want, want, want, want} {
			t.Fatalf("worker %d depth %v, want %d", x.Worker.Instance, x.Depth, want)
		}
	}
}

// TestEngineTableWidensIDs grows the node ids past the engine table's id
// field while the table itself stays small (other workers' chains reuse
// the first worker's engine hashes under other local hashes, so they are
// exceptions, not table entries): the insert that meets an id too wide
// rebuilds the table with a wider field, and every lookup still agrees
// with the reference.
func TestEngineTableWidensIDs(t *testing.T) {
	ix, rf := New(), ref.New()
	apply := func(ev kv.Event) { ix.Apply(ev); rf.Apply(ev) }
	const chain = 64
	chainOf := func(w, eng uint64) []kv.StoredBlock {
		blocks := make([]kv.StoredBlock, chain)
		for i := range blocks {
			blocks[i] = kv.StoredBlock{EngineHash: kv.EngineHash(eng<<32 | uint64(i)), LocalHash: kv.LocalHash(w<<32 | uint64(i))}
		}
		return blocks
	}
	a := kv.WorkerKey{Instance: 0}
	for w := uint64(0); ix.next < 1<<minIDBits+chain; w++ {
		apply(kv.Stored(kv.WorkerKey{Instance: w}, kv.TierDevice, nil, chainOf(w, 1)))
	}
	// A fresh chain of a's: its ids are past the field the table was
	// built with.
	before := ix.etab.idBits
	fresh := chainOf(1<<20, 2)
	apply(kv.Stored(a, kv.TierDevice, nil, fresh))
	if ix.etab.idBits <= before || len(ix.etab.slots) > 4096 {
		t.Fatalf("id field %d bits (was %d), %d slots: want a wider field in a small table", ix.etab.idBits, before, len(ix.etab.slots))
	}
	checkInternals(t, ix)
	path := make([]kv.LocalHash, chain)
	want := make([]kv.EngineHash, chain)
	for i := range path {
		path[i], want[i] = fresh[i].LocalHash, fresh[i].EngineHash
	}
	if got := ix.EngineHashes(a, path, nil); !slices.Equal(got, want) {
		t.Fatalf("a's fresh chain: engine hashes %v, want %v", got, want)
	}
	// Removing a's hashes resolves them through the rebuilt table.
	hs := make([]kv.EngineHash, chain)
	for i := range hs {
		hs[i] = fresh[i].EngineHash
	}
	apply(kv.Removed(a, kv.TierDevice, hs))
	if got, want := ix.BlockCounts(a), rf.BlockCounts(a); got != want {
		t.Fatalf("a holds %v, reference %v", got, want)
	}
	if s, r := ix.Stats(), rf.Stats(); s.RemoveUnknown != r.RemoveUnknown || s.Rebound != r.Rebound {
		t.Fatalf("stats %+v, reference %+v", s, r)
	}
	checkInternals(t, ix)
}

// TestManyChildren gives one node more children than its 15-bit count
// holds and takes them away again: the count moves to bigKids and back,
// and the node is freed exactly when its last child and holder go.
func TestManyChildren(t *testing.T) {
	ix, rf := New(), ref.New()
	apply := func(ev kv.Event) { ix.Apply(ev); rf.Apply(ev) }
	w := kv.WorkerKey{Instance: 1}
	root := kv.EngineHash(1)
	apply(kv.Stored(w, kv.TierDevice, nil, []kv.StoredBlock{{EngineHash: root, LocalHash: 1}}))
	const n = ncBig + 40
	for i := 0; i < n; i++ {
		apply(kv.Stored(w, kv.TierDevice, &root, []kv.StoredBlock{{EngineHash: kv.EngineHash(100 + i), LocalHash: kv.LocalHash(100 + i)}}))
	}
	p := ix.findChild(0, 1)
	if got := ix.childCount(p); got != n || ix.bigKids[p] != n {
		t.Fatalf("%d children counted (%d in bigKids), want %d", got, ix.bigKids[p], n)
	}
	checkInternals(t, ix)
	// Drop the children and the parent, the parent first: it stays
	// (childless nodes only are freed) until the last child goes.
	apply(kv.Removed(w, kv.TierDevice, []kv.EngineHash{root}))
	for i := 0; i < n; i++ {
		apply(kv.Removed(w, kv.TierDevice, []kv.EngineHash{kv.EngineHash(100 + i)}))
		if i == 60 {
			if got := ix.childCount(p); got != n-61 || len(ix.bigKids) != 0 {
				t.Fatalf("%d children counted (bigKids %v), want %d in the node", got, ix.bigKids, n-61)
			}
			checkInternals(t, ix)
		}
		if live := !ix.isFree(p); live != (i < n-1) {
			t.Fatalf("after removing child %d of %d the parent is live: %v", i+1, n, live)
		}
	}
	if s := ix.Stats(); s.Nodes != 0 || s.Holdings != 0 || s.RemoveUnknown != rf.Stats().RemoveUnknown {
		t.Fatalf("stats %+v", s)
	}
	checkInternals(t, ix)
}

// TestEngineTableSortedRebuild grows the engine table past
// rebuildSortedFrom, so its rebuilds fill it in slot order, and checks
// that every node with a shared hash is still found.
func TestEngineTableSortedRebuild(t *testing.T) {
	ix := New()
	w := kv.WorkerKey{Instance: 1}
	blocks := make([]kv.StoredBlock, 1000)
	for c := 0; len(ix.etab.slots) <= 2*rebuildSortedFrom; c++ {
		for i := range blocks {
			h := uint64(c)<<32 | uint64(i)
			blocks[i] = kv.StoredBlock{EngineHash: kv.EngineHash(h * 0x9E3779B97F4A7C15), LocalHash: kv.LocalHash(h)}
		}
		ix.Apply(kv.Stored(w, kv.TierDevice, nil, blocks))
	}
	checkInternals(t, ix)
}

// TestEngineTableGrowsAcrossInserts builds every engine table past the
// smallest across inserts (etabGrow) and checks the model still holds,
// and, at points during builds, both the current table and the new one
// once its build is run to the end.
func TestEngineTableGrowsAcrossInserts(t *testing.T) {
	defer func(g int) { growFrom = g }(growFrom)
	growFrom = 0
	t.Run("conversations", func(t *testing.T) { testConversations(t, Config{}) })
	ix := New()
	r := rand.New(rand.NewPCG(7, 9))
	ws := []kv.WorkerKey{{Instance: 1}, {Instance: 2}, {Instance: 3}}
	held := map[kv.WorkerKey][]kv.EngineHash{}
	builds, swaps, checks := 0, 0, 0
	var last *etabGrow
	for step := 0; step < 4000; step++ {
		w := ws[r.IntN(len(ws))]
		before := &ix.etab.slots[0]
		switch {
		case r.IntN(4) == 0 && len(held[w]) > 0:
			// Remove a random run of w's blocks: deletes during a build.
			hs := held[w]
			i := r.IntN(len(hs))
			j := min(len(hs), i+1+r.IntN(40))
			ix.Apply(kv.Removed(w, kv.TierDevice, append([]kv.EngineHash(nil), hs[i:j]...)))
			held[w] = append(hs[:i:i], hs[j:]...)
		default:
			blocks := make([]kv.StoredBlock, 1+r.IntN(60))
			for i := range blocks {
				h := r.Uint64()
				blocks[i] = kv.StoredBlock{EngineHash: kv.EngineHash(h), LocalHash: kv.LocalHash(h >> 7)}
				held[w] = append(held[w], kv.EngineHash(h))
			}
			ix.Apply(kv.Stored(w, kv.TierDevice, nil, blocks))
		}
		if last != nil && ix.egrow == nil && &ix.etab.slots[0] != before {
			swaps++ // a build finished by the inserts themselves
		}
		g := ix.egrow
		if g != nil && g != last {
			builds++
		}
		last = g
		if g != nil {
			if step%37 == 0 {
				checkInternals(t, ix) // the current table, mid-build
				for ix.egrow != nil {
					ix.etabGrowStep()
				}
				checkInternals(t, ix) // the new one
				checks++
				last = nil
			}
		}
	}
	checkInternals(t, ix)
	if builds == 0 || checks == 0 || swaps == 0 {
		t.Fatalf("%d builds started, %d swapped in, %d checked mid-build: want each", builds, swaps, checks)
	}
	t.Logf("%d builds, %d swapped, %d checked mid-build, %d slots", builds, swaps, checks, len(ix.etab.slots))
}
