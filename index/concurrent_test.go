package index

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvmesh/kvmesh/index/ref"
	"github.com/kvmesh/kvmesh/kv"
)

// closedGen produces events under which every worker's holdings on each
// tier stay prefix-closed at every step, even within an event: a store
// extends the worker's chain on that tier from where it ends (blocks in
// order), a remove cuts a tail deepest block first. A concurrent find may
// read each level of its walk at a later state than the level above, and
// with prefix-closed holdings the depth it reports for a worker then lies
// between the least and the greatest depth the model gives over the
// states the find overlapped (see checkWindow).
type closedGen struct {
	r       *rand.Rand
	workers []kv.WorkerKey
	convs   [][]kv.LocalHash
	held    map[kv.WorkerKey]map[int]*[kv.NumTiers]int // worker -> conversation -> depth per tier
}

func newClosedGen(seed uint64, nWorkers, nConvs, maxLen int) *closedGen {
	g := &closedGen{r: rand.New(rand.NewPCG(seed, seed*3+1)), held: map[kv.WorkerKey]map[int]*[kv.NumTiers]int{}}
	for i := 0; i < nWorkers; i++ {
		g.workers = append(g.workers, kv.WorkerKey{Instance: uint64(1 + g.r.IntN(nWorkers)), DPRank: uint32(i)})
	}
	sys := make([]kv.LocalHash, sysLen)
	for i := range sys {
		sys[i] = kv.LocalHash(g.r.Uint64())
	}
	for c := 0; c < nConvs; c++ {
		conv := make([]kv.LocalHash, 1+g.r.IntN(maxLen))
		for i := range conv {
			switch {
			case g.shares(c) && i < len(sys):
				conv[i] = sys[i]
			case g.shares(c) && i == len(sys) || i == 0:
				conv[i] = kv.LocalHash(g.r.Uint64()) // conversations part here for sure
			default:
				conv[i] = kv.LocalHash(g.r.Uint64() & 0xFF) // equal blocks under different parents
			}
		}
		g.convs = append(g.convs, conv)
	}
	return g
}

// sysLen is the length of the prefix shared by every conversation c with
// shares(c).
const sysLen = 6

func (g *closedGen) shares(c int) bool { return c%3 != 0 }

// floor is how far a remove may cut w's conversation c on tier: not into
// the shared prefix w holds there for another conversation.
func (g *closedGen) floor(w kv.WorkerKey, c int, tier kv.Tier) int {
	f := 0
	if g.shares(c) {
		for c2, dp := range g.held[w] {
			if c2 != c && g.shares(c2) {
				f = max(f, min(sysLen, dp[tier]))
			}
		}
	}
	return f
}

// engine is the hash w stores conversation c's block i under: canonical,
// except that some workers name blocks their own way.
func (g *closedGen) engine(w kv.WorkerKey, c, i int) kv.EngineHash {
	e := kv.EngineHash(kv.SeqHashes(nil, g.convs[c][:i+1])[i])
	if w.DPRank%7 == 3 {
		e ^= kv.EngineHash(w.DPRank+1) << 40
	}
	return e
}

func (g *closedGen) event() (kv.Event, bool) {
	w := g.workers[g.r.IntN(len(g.workers))]
	c := g.r.IntN(len(g.convs))
	tier := kv.TierDevice
	if g.r.IntN(4) == 0 {
		tier = kv.Tier(g.r.IntN(kv.NumTiers))
	}
	if g.held[w] == nil {
		g.held[w] = map[int]*[kv.NumTiers]int{}
	}
	dp := g.held[w][c]
	if dp == nil {
		dp = new([kv.NumTiers]int)
		g.held[w][c] = dp
	}
	d, conv := dp[tier], g.convs[c]
	if g.r.IntN(100) < 60 {
		if d >= len(conv) {
			return kv.Event{}, false
		}
		to := min(len(conv), d+1+g.r.IntN(24))
		var blocks []kv.StoredBlock
		for i := d; i < to; i++ {
			blocks = append(blocks, kv.StoredBlock{EngineHash: g.engine(w, c, i), LocalHash: conv[i]})
		}
		var parent *kv.EngineHash
		if d > 0 {
			p := g.engine(w, c, d-1)
			parent = &p
		}
		dp[tier] = to
		return kv.Stored(w, tier, parent, blocks), true
	}
	f := g.floor(w, c, tier)
	if d <= f {
		return kv.Event{}, false
	}
	n := 1 + g.r.IntN(d-f)
	var hs []kv.EngineHash
	for i := d - 1; i >= d-n; i-- {
		hs = append(hs, g.engine(w, c, i))
	}
	dp[tier] = d - n
	return kv.Removed(w, tier, hs), true
}

func (g *closedGen) query() []kv.LocalHash {
	conv := g.convs[g.r.IntN(len(g.convs))]
	q := append([]kv.LocalHash(nil), conv[:1+g.r.IntN(len(conv))]...)
	if g.r.IntN(4) == 0 {
		q[g.r.IntN(len(q))] ^= 1 // diverge
	}
	return q
}

// finder is what the stress test drives: an Index or a Sharded.
type finder interface {
	Apply(kv.Event)
	FindMatches([]kv.LocalHash, []Match) []Match
}

// observation is one concurrent find: its answer and, per shard, how many
// of that shard's events were applied before it started and after it ended.
type observation struct {
	q        int
	from, to []int
	got      []Match
}

// TestConcurrentFindsWithinModel runs writers (one per shard) and readers
// at once and checks every find against the reference model: each
// worker's depth on each tier must lie within what the model gives over
// the states the find overlapped. Run it with -race too.
// With 120 workers, workers keep joining while finds run, so Sharded's
// placement changes under them.
func TestConcurrentFindsWithinModel(t *testing.T) {
	for _, c := range []struct{ shards, workers int }{{1, 24}, {3, 24}, {2, 120}} {
		for seed := uint64(1); seed <= 2; seed++ {
			t.Run(fmt.Sprintf("shards%d/w%d/s%d", c.shards, c.workers, seed), func(t *testing.T) {
				stressAgainstModel(t, seed, c.shards, c.workers)
			})
		}
	}
}

func stressAgainstModel(t *testing.T, seed uint64, shards, workers int) {
	g := newClosedGen(seed, workers, 10, 120)
	nev := 2000
	if testing.Short() {
		nev = 800
	}
	var evs []kv.Event
	for len(evs) < nev {
		if ev, ok := g.event(); ok {
			evs = append(evs, ev)
		}
	}
	queries := make([][]kv.LocalHash, 12)
	for i := range queries {
		queries[i] = g.query()
	}
	var ix finder
	shardOf := func(kv.WorkerKey) int { return 0 }
	if shards == 1 {
		ix = New()
	} else {
		s := NewSharded(shards, Config{})
		ix, shardOf = s, s.ShardOf
	}
	// Each shard's events in order, and the model's answer to every query
	// after each prefix of them.
	per := make([][]kv.Event, shards)
	for _, ev := range evs {
		k := shardOf(ev.Worker)
		per[k] = append(per[k], ev)
	}
	model := make([][][]map[kv.WorkerKey]ref.Match, shards) // shard, query, applied
	for k := range per {
		rf := ref.New()
		model[k] = make([][]map[kv.WorkerKey]ref.Match, len(queries))
		snap := func() {
			for qi, q := range queries {
				m := map[kv.WorkerKey]ref.Match{}
				for _, x := range rf.FindMatches(q, nil) {
					m[x.Worker] = x
				}
				model[k][qi] = append(model[k][qi], m)
			}
		}
		snap()
		for _, ev := range per[k] {
			rf.Apply(ev)
			snap()
		}
	}

	applied := make([]atomic.Int64, shards)
	var writers, readers sync.WaitGroup
	var done atomic.Bool
	for k := range per {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for i, ev := range per[k] {
				ix.Apply(ev)
				applied[k].Store(int64(i + 1))
				runtime.Gosched() // let finds overlap the events, not follow them
			}
		}()
	}
	obs := make([][]observation, 3)
	for r := range obs {
		readers.Add(1)
		go func() {
			defer readers.Done()
			rr := rand.New(rand.NewPCG(seed, uint64(r)))
			for !done.Load() && len(obs[r]) < 20000 {
				o := observation{q: rr.IntN(len(queries)), from: make([]int, shards), to: make([]int, shards)}
				for k := range applied {
					o.from[k] = int(applied[k].Load())
				}
				o.got = ix.FindMatches(queries[o.q], nil)
				for k := range applied {
					o.to[k] = int(applied[k].Load())
				}
				obs[r] = append(obs[r], o)
			}
		}()
	}
	writers.Wait()
	done.Store(true)
	readers.Wait()
	n, mid := 0, 0
	for _, os := range obs {
		for _, o := range os {
			n++
			for k := range o.from {
				if o.from[k] != o.to[k] {
					mid++
					break
				}
			}
			if err := checkWindow(o, model, shardOf, len(queries[o.q])); err != nil {
				t.Fatalf("find of query %d (%d blocks) during events %v..%v: %v\ngot %v", o.q, len(queries[o.q]), o.from, o.to, err, o.got)
			}
		}
	}
	if n == 0 {
		t.Fatal("no find ran")
	}
	t.Logf("%d finds checked, %d of them overlapped events", n, mid)
	// Quiescent: every query equals the model exactly.
	for qi, q := range queries {
		got := ix.FindMatches(q, nil)
		want := 0
		for k := range model {
			want += len(model[k][qi][len(per[k])])
		}
		if len(got) != want {
			t.Fatalf("query %d after the events: %d matches, model %d", qi, len(got), want)
		}
		for j, m := range got {
			if j > 0 && !less(got[j-1].Worker, m.Worker) {
				t.Fatalf("query %d: unordered %v", qi, got)
			}
			k := shardOf(m.Worker)
			if ref.Match(m) != model[k][qi][len(per[k])][m.Worker] {
				t.Fatalf("query %d after the events: %v, model %v", qi, m, model[k][qi][len(per[k])][m.Worker])
			}
		}
	}
}

// checkWindow checks o against the model's states from o.from to o.to+1
// per shard (+1: the event being applied while the find ended may be half
// visible).
func checkWindow(o observation, model [][][]map[kv.WorkerKey]ref.Match, shardOf func(kv.WorkerKey) int, qlen int) error {
	type bounds struct{ lo, hi [kv.NumTiers]uint32 }
	b := map[kv.WorkerKey]*bounds{}
	for k := range model {
		states := model[k][o.q]
		last := min(o.to[k]+1, len(states)-1)
		for v := o.from[k]; v <= last; v++ {
			for w, m := range states[v] {
				if b[w] == nil {
					b[w] = &bounds{}
					b[w].lo = m.Depth
				}
			}
		}
		for w, x := range b {
			if shardOf(w) != k {
				continue
			}
			for v := o.from[k]; v <= last; v++ {
				d := states[v][w].Depth // zero when absent
				for t := range d {
					x.lo[t] = min(x.lo[t], d[t])
					x.hi[t] = max(x.hi[t], d[t])
				}
			}
		}
	}
	seen := map[kv.WorkerKey]bool{}
	for j, m := range o.got {
		if j > 0 && !less(o.got[j-1].Worker, m.Worker) {
			return fmt.Errorf("unordered result")
		}
		seen[m.Worker] = true
		x := b[m.Worker]
		if x == nil {
			return fmt.Errorf("worker %v matches, the model never had it", m.Worker)
		}
		for t := range m.Depth {
			if m.Depth[t] < x.lo[t] || m.Depth[t] > x.hi[t] || int(m.Depth[t]) > qlen {
				return fmt.Errorf("worker %v depth %v outside the model's %v..%v", m.Worker, m.Depth, x.lo, x.hi)
			}
		}
	}
	for w, x := range b {
		if !seen[w] && x.lo[kv.NumTiers-1] > 0 {
			return fmt.Errorf("worker %v missing; the model held at least %v throughout", w, x.lo)
		}
	}
	return nil
}
