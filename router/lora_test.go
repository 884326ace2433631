package router

import (
	"context"
	"errors"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

// A request naming a LoRA adapter goes only to workers that serve it and
// is hinted only from them; a base-model request may go anywhere; an
// adapter nobody serves is ErrNoWorkers.
func TestRouteLoRA(t *testing.T) {
	ix := newFakeIndex()
	r, err := New(Config{Matcher: ix, Hints: true})
	if err != nil {
		t.Fatal(err)
	}
	for i, loras := range map[uint64][]string{1: {"a"}, 2: {"b"}, 3: {"a", "b"}} {
		w := winfo(i)
		w.LoRAs = loras
		if err := r.AddWorker(w); err != nil {
			t.Fatal(err)
		}
	}
	toks := prompt(3, 20*testBS)
	_, seqA := kv.NewHasher(testBS, "a", "").Blocks(toks)
	// Worker 2 holds the prompt in adapter a's domain (it cannot, not
	// serving a; a stale or lying index must still not make it a
	// candidate or a source); worker 3 holds half of it.
	ix.store(key(2), kv.TierDevice, seqA)
	ix.store(key(3), kv.TierDevice, seqA[:10])
	// Worker 3 is loaded, so the idle worker 1 is picked and hinted.
	heavy, err := r.Route(context.Background(), Request{Model: "m", Tokens: prompt(4, 8000), LoRA: "a", Exclude: []kv.WorkerKey{key(1)}})
	if err != nil || heavy.Worker != key(3) {
		t.Fatalf("heavy request: %v %v", heavy, err)
	}
	seen := map[kv.WorkerKey]int{}
	for range 40 {
		d, err := r.Route(context.Background(), Request{Model: "m", Tokens: toks, LoRA: "a"})
		if err != nil {
			t.Fatal(err)
		}
		seen[d.Worker]++
		switch {
		case d.Worker == key(2):
			t.Fatal("adapter a routed to worker 2, which does not serve it")
		case d.Worker == key(1) && (d.Hint == nil || d.Hint.Source != key(3) || len(d.Hint.Hashes) != 10):
			t.Fatalf("adapter request on worker 1: hint %+v, want 10 blocks from worker 3 (worker 2 holds 20 but does not serve a)", d.Hint)
		case d.Worker == key(3) && d.Hint != nil:
			t.Fatalf("adapter request on worker 3 hinted from %v", d.Hint.Source)
		}
		d.Done()
	}
	if seen[key(1)] == 0 {
		t.Fatalf("adapter a routed %v, want worker 1 while 3 is loaded", seen)
	}
	heavy.Done()
	if _, err := r.Route(context.Background(), Request{Model: "m", Tokens: toks, LoRA: "c"}); !errors.Is(err, kv.ErrNoWorkers) {
		t.Fatalf("unknown adapter: %v, want ErrNoWorkers", err)
	}
	d, err := r.Route(context.Background(), Request{Model: "m", Tokens: toks, LoRA: "b", Exclude: []kv.WorkerKey{key(3)}})
	if err != nil || d.Worker != key(2) {
		t.Fatalf("adapter b: %v %v, want worker 2", d, err)
	}
	if d.Overlap[kv.NumTiers-1] != 0 || d.Hint != nil {
		t.Fatalf("adapter b credited adapter a's blocks: overlap %v hint %+v", d.Overlap, d.Hint)
	}
	d.Done()
	base := map[kv.WorkerKey]bool{}
	for i := range 60 {
		d, err := r.Route(context.Background(), Request{Model: "m", Tokens: prompt(100+i, 4*testBS)})
		if err != nil {
			t.Fatal(err)
		}
		base[d.Worker] = true
	}
	if len(base) != 3 {
		t.Fatalf("base-model requests went to %v, want all three workers", base)
	}
}
