package kvbm

import (
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

// TestFullTierStoresAChainAsOneEvent: storing a chain into a full host tier
// evicts a block per block stored; the evictions go ahead of the chain, so
// one Offload is one Removed and one Stored event, ids in order.
func TestFullTierStoresAChainAsOneEvent(t *testing.T) {
	var evs []kv.Event
	h, err := NewHostArena(8, tBB)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewManager(Config{BlockSize: tBS, BlockBytes: tBB, Host: h, Events: func(b []kv.Event) { evs = append(evs, b...) }})
	if err != nil {
		t.Fatal(err)
	}
	dev := newFakeDevice(16)
	ids := dev.alloc(t, 13)
	chain := func(from, n int, base uint64) []StoreBlock {
		var out []StoreBlock
		for i := range n {
			s := StoreBlock{Device: ids[from+i], Meta: BlockMeta{Seq: kv.SeqHash(base + uint64(i)), Local: kv.LocalHash(base + uint64(i))}}
			if i > 0 {
				s.Meta.Parent, s.Meta.HasParent = kv.SeqHash(base+uint64(i-1)), true
			}
			fillBlock(dev.blocks[s.Device], s.Meta.Seq)
			out = append(out, s)
		}
		return out
	}
	if n, err := m.Offload(dev, chain(0, 8, 100)); n != 8 || err != nil {
		t.Fatalf("fill: %d %v", n, err)
	}
	evs = nil
	if n, err := m.Offload(dev, chain(8, 5, 200)); n != 5 || err != nil {
		t.Fatalf("offload: %d %v", n, err)
	}
	if len(evs) != 2 || evs[0].Kind != kv.EventRemoved || len(evs[0].Removed) != 5 ||
		evs[1].Kind != kv.EventStored || len(evs[1].Blocks) != 5 || evs[1].ID != evs[0].ID+1 {
		t.Fatalf("events %+v, want one Removed of 5 then one Stored of 5", evs)
	}
}
