package router

import (
	"context"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/kv"
)

// storeEvent is the Stored event of a worker holding tokens' full blocks on
// tier t, under engine hashes of its own (engHash), as a real engine names
// them.
func storeEvent(w kv.WorkerKey, t kv.Tier, tokens []kv.Token) kv.Event {
	local, seq := kv.NewHasher(testBS, "", "").Blocks(tokens)
	blocks := make([]kv.StoredBlock, len(local))
	for i := range local {
		blocks[i] = kv.StoredBlock{EngineHash: engHash(w, seq[i]), LocalHash: local[i]}
	}
	return kv.Stored(w, t, nil, blocks)
}

func TestKVModeWithEventIndex(t *testing.T) {
	ix := index.New()
	r := newRouter(t, Config{Matcher: ix, Hints: true}, 1, 2, 3)
	p := prompt(21, 1024) // 64 blocks
	ix.Apply(storeEvent(key(2), kv.TierDevice, p[:512]))
	ix.Apply(storeEvent(key(3), kv.TierHost, p))
	d := route(t, r, p)
	// Worker 2: credit 32 → cost 32+64 = 96; worker 3: credit 48 → 16+64 = 80.
	if d.Worker != key(3) || d.Overlap != [kv.NumTiers]uint32{0, 64, 64, 64} {
		t.Fatalf("decision %v overlap %v", d.Worker, d.Overlap)
	}
	if d.Hint != nil {
		t.Fatalf("hint to the longest holder: %+v", d.Hint)
	}
	// Load worker 3 up; the next copy goes to worker 2 with a hint to fetch
	// the rest from worker 3.
	d2, err := r.Route(context.Background(), Request{Model: "m", Tokens: prompt(22, 2048), Exclude: []kv.WorkerKey{key(1), key(2)}})
	if err != nil || d2.Worker != key(3) {
		t.Fatalf("filler: %v %v", d2, err)
	}
	d3 := route(t, r, p)
	if d3.Worker != key(2) || d3.Hint == nil || d3.Hint.Source != key(3) || d3.Overlap[kv.NumTiers-1] != 32 {
		t.Fatalf("decision %v hint %+v", d3.Worker, d3.Hint)
	}
	// The hint names worker 3's blocks by worker 3's own engine hashes.
	seq := seqOf(p)
	for i, h := range d3.Hint.Hashes {
		if h != engHash(key(3), seq[i]) {
			t.Fatalf("hint hash %d is %x, want worker 3's %x", i, h, engHash(key(3), seq[i]))
		}
	}
	if len(d3.Hint.Hashes) != 64 {
		t.Fatalf("hint of %d blocks, want 64", len(d3.Hint.Hashes))
	}
	// A worker the request already failed on is no source.
	d4, err := r.Route(context.Background(), Request{Model: "m", Tokens: p, Exclude: []kv.WorkerKey{key(3)}})
	if err != nil || (d4.Hint != nil && d4.Hint.Source == key(3)) {
		t.Fatalf("hint from an excluded worker: %v %+v", err, d4.Hint)
	}
	if d4.Worker == key(1) && (d4.Hint == nil || d4.Hint.Source != key(2)) {
		t.Fatalf("cold worker should fetch from worker 2: %+v", d4.Hint)
	}
}

func TestKVApproxWithRealIndex(t *testing.T) {
	clk := newFakeClock()
	r := newRouter(t, Config{Mode: ModeKVApprox, Now: clk.Now}, 1, 2, 3, 4)
	p := prompt(31, 512)
	first := route(t, r, p)
	first.Done()
	clk.Advance(119 * time.Second)
	d := route(t, r, p)
	if d.Worker != first.Worker || d.CachedTokens != 512 {
		t.Fatalf("within the TTL: went to %v cached %d", d.Worker, d.CachedTokens)
	}
	d.Done()
	clk.Advance(121 * time.Second) // the refresh above expires now
	d = route(t, r, p)
	if d.CachedTokens != 0 {
		t.Fatalf("after the TTL still cached on %v", d.Worker)
	}
	// Removing a worker drops its predicted holdings.
	d.Done()
	r.RemoveWorker(d.Worker)
	if err := r.AddWorker(winfo(d.Worker.Instance)); err != nil {
		t.Fatal(err)
	}
	if d2 := route(t, r, p); d2.CachedTokens != 0 {
		t.Fatalf("removed worker's holdings survived: %v", d2.Worker)
	}
}
