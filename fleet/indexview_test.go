package fleet

import (
	"reflect"
	"testing"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/kv"
)

// The view lists exactly what each worker key holds per tier after stores,
// a remove that leaves a hole (the index's dump stores and removes filler
// blocks for it) and a Cleared; HeldBlocks folds a worker's own dump the
// same way, so the two compare block for block.
func TestIndexViewHoldings(t *testing.T) {
	a, b := kv.WorkerKey{Instance: 0xa1}, kv.WorkerKey{Instance: 0xb2, DPRank: 1}
	chain := func(hs ...uint64) []kv.StoredBlock {
		out := make([]kv.StoredBlock, len(hs))
		for i, h := range hs {
			out[i] = kv.StoredBlock{EngineHash: kv.EngineHash(h + 1000), LocalHash: kv.LocalHash(h)}
		}
		return out
	}
	ix := index.New()
	evs := []kv.Event{
		kv.Stored(a, kv.TierDevice, nil, chain(1, 2, 3)),
		kv.Removed(a, kv.TierDevice, []kv.EngineHash{1002}),
		kv.Stored(a, kv.TierHost, nil, chain(1)),
		kv.Stored(b, kv.TierDevice, nil, chain(7, 8)),
		kv.Cleared(b),
		kv.Stored(b, kv.TierDevice, nil, chain(9)),
	}
	for i := range evs {
		evs[i].ID = uint64(i + 1)
		ix.Apply(evs[i])
	}
	v := indexView(ix)
	want := []WorkerHoldings{
		{Instance: "a1", Blocks: map[string][]kv.EngineHash{"device": {1001, 1003}, "host": {1001}}},
		{Instance: "b2", DPRank: 1, Blocks: map[string][]kv.EngineHash{"device": {1009}}},
	}
	if !reflect.DeepEqual(v.Workers, want) {
		t.Fatalf("view %+v\nwant %+v", v.Workers, want)
	}
	if got := HeldBlocks(evs[:3]); !reflect.DeepEqual(got, want[0].Blocks) {
		t.Errorf("HeldBlocks of a's events: %v, want %v", got, want[0].Blocks)
	}
	ix.RemoveWorker(a)
	if v := indexView(ix); len(v.Workers) != 1 || v.Workers[0].Instance != "b2" {
		t.Errorf("after removing a: %+v", v.Workers)
	}
}
