package index

import (
	"github.com/kvmesh/kvmesh/internal/cputime"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// deepTree: 256 workers share a 16-block prefix, then each holds its own
// 1000-block chain below it.
func deepTree(b *testing.B) (*Index, []kv.LocalHash) {
	ix := New()
	prefix := make([]kv.StoredBlock, 16)
	for i := range prefix {
		prefix[i] = kv.StoredBlock{EngineHash: kv.EngineHash(i + 1), LocalHash: kv.LocalHash(i + 1)}
	}
	var q []kv.LocalHash
	for w := 0; w < 256; w++ {
		wk := kv.WorkerKey{Instance: uint64(w)}
		ix.Apply(kv.Stored(wk, kv.TierDevice, nil, prefix))
		p := kv.EngineHash(16)
		chain := make([]kv.StoredBlock, 1000)
		for i := range chain {
			chain[i] = kv.StoredBlock{EngineHash: kv.EngineHash(uint64(w)<<32 | uint64(i+100)), LocalHash: kv.LocalHash(uint64(w)<<32 | uint64(i+100))}
		}
		ix.Apply(kv.Stored(wk, kv.TierDevice, &p, chain))
		if w == 7 {
			for _, s := range prefix {
				q = append(q, s.LocalHash)
			}
			for _, s := range chain {
				q = append(q, s.LocalHash)
			}
		}
	}
	return ix, q
}

func BenchmarkFindMatchesWide(b *testing.B) {
	ix, q := deepTree(b)
	q = q[:20] // shared prefix, then one worker: 256 matches
	var dst []Match
	for b.Loop() {
		dst = ix.FindMatches(q, dst[:0])
	}
	if len(dst) != 256 {
		b.Fatal(len(dst))
	}
}

func BenchmarkFindMatchesDeep(b *testing.B) {
	ix, q := deepTree(b)
	var dst []Match
	for b.Loop() {
		dst = ix.FindMatches(q, dst[:0])
	}
	b.ReportMetric(float64(len(q)), "blocks/query")
}

func BenchmarkApplyStoredRemoved(b *testing.B) {
	ix := New()
	w := kv.WorkerKey{Instance: 1}
	blocks := make([]kv.StoredBlock, 64)
	hashes := make([]kv.EngineHash, 64)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		for j := range blocks {
			h := uint64(i)<<8 | uint64(j)
			blocks[j] = kv.StoredBlock{EngineHash: kv.EngineHash(h), LocalHash: kv.LocalHash(h)}
			hashes[j] = kv.EngineHash(h)
		}
		ix.Apply(kv.Stored(w, kv.TierDevice, nil, blocks))
		ix.Apply(kv.Removed(w, kv.TierDevice, hashes))
	}
	b.ReportMetric(float64(b.N*128)/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkApplyFreshChains stores new 180-block chains (the shape of a
// Stored event at block size 64 in the Mooncake trace) over 256 workers,
// each chain below a shared 16-block prefix.
func BenchmarkApplyFreshChains(b *testing.B) {
	ix := New()
	prefix := make([]kv.StoredBlock, 16)
	for i := range prefix {
		prefix[i] = kv.StoredBlock{EngineHash: kv.EngineHash(i + 1), LocalHash: kv.LocalHash(i + 1)}
	}
	for w := 0; w < 256; w++ {
		ix.Apply(kv.Stored(kv.WorkerKey{Instance: uint64(w)}, kv.TierDevice, nil, prefix))
	}
	chain := make([]kv.StoredBlock, 180)
	p := kv.EngineHash(16)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		for j := range chain {
			h := uint64(i)<<20 | uint64(j) | 1<<60
			chain[j] = kv.StoredBlock{EngineHash: kv.EngineHash(h), LocalHash: kv.LocalHash(h)}
		}
		ix.Apply(kv.Stored(kv.WorkerKey{Instance: uint64(i % 256)}, kv.TierDevice, &p, chain))
	}
	b.ReportMetric(float64(b.N*len(chain))/b.Elapsed().Seconds(), "blocks/s")
}

// turnsTree: 256 workers share an 8-block prompt, then a conversation of
// 16 turns of 8 blocks, each stored as its own chain (a filler chain in
// between keeps turns from being consecutive ids); turn k is held by the
// workers with w%16 >= k, so 16 workers drop out at every turn, as they
// do in the Mooncake replay's slowest finds.
func turnsTree() (*Index, []kv.LocalHash) {
	ix := New()
	var q []kv.LocalHash
	h := uint64(1)
	block := func() kv.StoredBlock {
		h++
		return kv.StoredBlock{EngineHash: kv.EngineHash(h), LocalHash: kv.LocalHash(h)}
	}
	var parent *kv.EngineHash
	filler := kv.WorkerKey{Instance: 0}
	for k := 0; k <= 16; k++ {
		turn := make([]kv.StoredBlock, 8)
		for i := range turn {
			turn[i] = block()
			q = append(q, turn[i].LocalHash)
		}
		for w := 0; w < 256; w++ {
			if k == 0 || w%16 >= k-1 {
				ix.Apply(kv.Stored(kv.WorkerKey{Instance: uint64(w)}, kv.TierDevice, parent, turn))
			}
		}
		ix.Apply(kv.Stored(filler, kv.TierDevice, nil, []kv.StoredBlock{block(), block()}))
		last := turn[len(turn)-1].EngineHash
		parent = &last
	}
	return ix, q
}

func BenchmarkFindMatchesTurns(b *testing.B) {
	ix, q := turnsTree()
	var dst []Match
	for b.Loop() {
		dst = ix.FindMatches(q, dst[:0])
	}
	if len(dst) != 256 {
		b.Fatal(len(dst))
	}
}

// wide7000 is the shape of the 7,000-worker Mooncake replay's finds:
// 7,000 workers (keys in random order of arrival) share a 16-block
// prompt, each with a 4-block tail of its own; the query is the prompt
// and one worker's tail, so every worker matches and most stop at 16.
func wide7000(add func(kv.Event)) []kv.LocalHash {
	prefix := make([]kv.StoredBlock, 16)
	for i := range prefix {
		prefix[i] = kv.StoredBlock{EngineHash: kv.EngineHash(i + 1), LocalHash: kv.LocalHash(i + 1)}
	}
	p := kv.EngineHash(16)
	var q []kv.LocalHash
	for _, w := range rand.New(rand.NewPCG(1, 2)).Perm(7000) {
		wk := kv.WorkerKey{Instance: uint64(w + 1)}
		add(kv.Stored(wk, kv.TierDevice, nil, prefix))
		tail := make([]kv.StoredBlock, 4)
		for i := range tail {
			h := uint64(w+1)<<32 | uint64(i+100)
			tail[i] = kv.StoredBlock{EngineHash: kv.EngineHash(h), LocalHash: kv.LocalHash(h)}
		}
		add(kv.Stored(wk, kv.TierDevice, &p, tail))
		if w == 7 {
			for _, s := range prefix {
				q = append(q, s.LocalHash)
			}
			for _, s := range tail {
				q = append(q, s.LocalHash)
			}
		}
	}
	return q
}

func BenchmarkFindMatches7000(b *testing.B) {
	type finder interface {
		Apply(kv.Event)
		FindMatches([]kv.LocalHash, []Match) []Match
	}
	for _, c := range []struct {
		name string
		ix   finder
	}{{"index", New()}, {"sharded2", NewSharded(2, Config{})}} {
		b.Run(c.name, func(b *testing.B) {
			q := wide7000(c.ix.Apply)
			var dst []Match
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			c0 := cputime.Thread()
			for b.Loop() {
				dst = c.ix.FindMatches(q, dst[:0])
			}
			b.ReportMetric(float64(cputime.Thread()-c0)/float64(b.N), "cpu-ns/op")
			if len(dst) != 7000 {
				b.Fatal(len(dst))
			}
		})
	}
}

// BenchmarkEtabRebuild times one engine-table rebuild of an index whose
// 460k nodes all have a shared engine hash (a shard's table when it
// outgrows 512k slots at 7,000 workers): the work a table that size
// spreads over its inserts (etabGrow), or pays in one Apply when it
// reaches 7/8 before its build ends.
func BenchmarkEtabRebuild(b *testing.B) {
	ix := New()
	w := kv.WorkerKey{Instance: 1}
	blocks := make([]kv.StoredBlock, 1000)
	for c := 0; c < 920; c++ {
		for i := range blocks {
			h := uint64(c)<<32 | uint64(i)
			blocks[i] = kv.StoredBlock{EngineHash: kv.EngineHash(h * 0x9E3779B97F4A7C15), LocalHash: kv.LocalHash(h)}
		}
		ix.Apply(kv.Stored(w, kv.TierDevice, nil, blocks))
	}
	for b.Loop() {
		ix.etabRebuild(0)
	}
}

// BenchmarkJoinFind7000 is a join, a wide find and a leave at 7,000
// workers in 2 shards: the worst case for a placement ranked again by the
// first find after a join (every find follows one).
func BenchmarkJoinFind7000(b *testing.B) {
	s := NewSharded(2, Config{})
	q := wide7000(s.Apply)
	prefix := make([]kv.StoredBlock, 16)
	for i := range prefix {
		prefix[i] = kv.StoredBlock{EngineHash: kv.EngineHash(i + 1), LocalHash: kv.LocalHash(i + 1)}
	}
	var dst []Match
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c0 := cputime.Thread()
	n := uint64(0)
	for b.Loop() {
		// Keys spread over the others' (theirs are 1..7000).
		w := kv.WorkerKey{Instance: n%7000 + 1, DPRank: 1}
		n++
		s.Apply(kv.Stored(w, kv.TierDevice, nil, prefix))
		dst = s.FindMatches(q, dst[:0])
		if len(dst) != 7001 {
			b.Fatal(len(dst))
		}
		s.RemoveWorker(w)
	}
	b.ReportMetric(float64(cputime.Thread()-c0)/float64(b.N), "cpu-ns/op")
}

// BenchmarkEtabGrowPause stores 920k blocks with shared engine hashes in
// Applies of 100 (the engine table grows past 2M slots) and reports the
// longest Apply in thread CPU time, which a busy box does not inflate, and
// the CPU of the whole fill: "rebuild" rebuilds each table inside one
// Apply (growFrom out of reach), "grow" builds the next table across
// inserts. Run both in one process, alternated by -count.
func BenchmarkEtabGrowPause(b *testing.B) {
	for _, c := range []struct {
		name string
		from int
	}{{"rebuild", 1 << 62}, {"grow", growFrom}} {
		b.Run(c.name, func(b *testing.B) {
			defer func(g int) { growFrom = g }(growFrom)
			growFrom = c.from
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			w := kv.WorkerKey{Instance: 1}
			blocks := make([]kv.StoredBlock, 100)
			var longest, total time.Duration
			for b.Loop() {
				ix := New()
				for c := 0; c < 9200; c++ {
					for i := range blocks {
						h := uint64(c)<<32 | uint64(i)
						blocks[i] = kv.StoredBlock{EngineHash: kv.EngineHash(h * 0x9E3779B97F4A7C15), LocalHash: kv.LocalHash(h)}
					}
					ev := kv.Stored(w, kv.TierDevice, nil, blocks)
					t0 := cputime.Thread()
					ix.Apply(ev)
					d := cputime.Thread() - t0
					longest = max(longest, d)
					total += d
				}
			}
			b.ReportMetric(float64(longest.Microseconds()), "max-apply-cpu-µs")
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "cpu-ms/fill")
		})
	}
}
