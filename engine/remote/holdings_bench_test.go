package remote

import (
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

// BenchmarkHoldings64k: the relay's holdings taking one 64k-token prompt's
// events (4,096 blocks stored in batches of 64, as a chain) and their
// eviction, on top of 16k blocks already held.
//
//	go test ./engine/remote -run '^$' -bench Holdings64k
func BenchmarkHoldings64k(b *testing.B) {
	w := kv.WorkerKey{}
	h := newRankHoldings()
	base := make([]kv.StoredBlock, 16384)
	for i := range base {
		base[i].EngineHash = kv.EngineHash(1<<40 + i)
	}
	h.apply([]kv.Event{kv.Stored(w, kv.TierDevice, nil, base)})
	round := uint64(0)
	for b.Loop() {
		round++
		var stored, removed []kv.Event
		var parent *kv.EngineHash
		for batch := range 64 {
			blocks := make([]kv.StoredBlock, 64)
			hashes := make([]kv.EngineHash, 64)
			for i := range blocks {
				blocks[i].EngineHash = kv.EngineHash(round<<20 | uint64(batch*64+i))
				hashes[i] = blocks[i].EngineHash
			}
			stored = append(stored, kv.Stored(w, kv.TierDevice, parent, blocks))
			removed = append(removed, kv.Removed(w, kv.TierDevice, hashes))
			last := blocks[63].EngineHash
			parent = &last
		}
		h.apply(stored)
		h.apply(removed)
	}
}
