package router

import (
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

// TestLoadSoloAgainstUnion books and frees requests on a load at random,
// its own (which may be held solo) and replicas', and checks after each
// step that the active blocks and every query's active prefix are those of
// the union of the sequences in flight, counted block by block.
func TestLoadSoloAgainstUnion(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	// A prompt's block i is named by its family, i, and (past the family's
	// split) its branch: prompts of a family share the blocks before the
	// split, as sequence hashes of a common prefix do.
	seqOf := func(family, branch, n int) []kv.SeqHash {
		seq := make([]kv.SeqHash, n)
		split := 2 + family%5
		for i := range seq {
			b := 0
			if i >= split {
				b = branch
			}
			seq[i] = kv.SeqHash(uint64(family+1)<<40 | uint64(b)<<20 | uint64(i+1))
		}
		return seq
	}
	randomSeq := func() []kv.SeqHash { return seqOf(rng.IntN(3), rng.IntN(3), rng.IntN(12)) }
	var l load
	var inFlight []*active
	soloSeen := 0
	for step := range 20_000 {
		if len(inFlight) == 0 || (len(inFlight) < 4 && rng.IntN(2) == 0) {
			a := &active{load: &l, seq: randomSeq(), private: int64(rng.IntN(2))}
			own := rng.IntN(4) != 0
			if !own && len(a.seq) > 0 && rng.IntN(2) == 0 {
				a.seq = append(a.seq, a.seq[0]) // a replica's sequence is taken as sent
			}
			l.add(a, own)
			inFlight = append(inFlight, a)
		} else {
			i := rng.IntN(len(inFlight))
			l.free(inFlight[i])
			inFlight = append(inFlight[:i], inFlight[i+1:]...)
		}
		if l.solo != nil {
			soloSeen++
		}
		union := map[kv.SeqHash]bool{}
		var private int64
		for _, a := range inFlight {
			for _, h := range a.seq {
				union[h] = true
			}
			private += a.private
		}
		if got, want := l.uniqueBlocks(), int64(len(union))+private; got != want {
			t.Fatalf("step %d: unique blocks %d, want %d (%d in flight, solo %v)", step, got, want, len(inFlight), l.solo != nil)
		}
		for range 4 {
			q := randomSeq()
			want := 0
			for want < len(q) && union[q[want]] {
				want++
			}
			if got := l.activePrefix(q); got != want {
				t.Fatalf("step %d: active prefix of %v is %d, want %d (solo %v)", step, q, got, want, l.solo != nil)
			}
		}
		if int(l.requests) != len(inFlight) {
			t.Fatalf("step %d: %d requests, want %d", step, l.requests, len(inFlight))
		}
	}
	if soloSeen < 1000 {
		t.Fatalf("the solo request was held in %d steps only: the test does not exercise it", soloSeen)
	}
}
