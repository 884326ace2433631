package router

import (
	"context"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

// In kv mode, workers whose engines publish no KV events are credited with
// what the router sent them (the approximate index), so a shared prefix
// keeps going where it went; a worker with events still reads the event
// index only, and a blind worker is never a hint source (its overlap is a
// prediction with no engine hashes behind it).
func TestKVModePredictsWorkersWithoutEvents(t *testing.T) {
	ix := newFakeIndex()
	r := newRouter(t, Config{Mode: ModeKV, Matcher: ix})
	for _, w := range []uint64{1, 2, 3} {
		info := winfo(w)
		info.NoKVEvents = w >= 2
		if err := r.AddWorker(info); err != nil {
			t.Fatal(err)
		}
	}
	p := prompt(7, 640)
	// The first request lands on worker 3 (1 and 2 excluded): from then on
	// the prefix is predicted there, though no event ever says so.
	first, err := r.Route(context.Background(), Request{Model: "m", Tokens: p, Exclude: []kv.WorkerKey{key(1), key(2)}})
	if err != nil {
		t.Fatal(err)
	}
	first.Done()
	if first.Worker != key(3) {
		t.Fatalf("first went to %v", first.Worker)
	}
	for i := range 5 {
		d := route(t, r, p)
		if d.Worker != key(3) || d.CachedTokens != 640 {
			t.Fatalf("repeat %d: worker %v cached %d, want worker 3 with 640 predicted", i, d.Worker, d.CachedTokens)
		}
		if d.Hint != nil {
			t.Fatalf("repeat %d: hint from %v: a blind worker is no source", i, d.Hint.Source)
		}
		d.Done()
	}
	// Removed, its predictions go with it.
	r.RemoveWorker(key(3))
	if d := route(t, r, p); d.CachedTokens != 0 {
		t.Fatalf("after removal: %v credited %d tokens", d.Worker, d.CachedTokens)
	}
}
