package router

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"reflect"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

// bus collects the events a replica emits.
type bus struct {
	mu  sync.Mutex
	evs [][]byte
}

func (b *bus) publish(ev ReplicaEvent) {
	buf, err := ev.MarshalBinary() // through the wire form, as the runtime would
	if err != nil {
		panic(err)
	}
	b.mu.Lock()
	b.evs = append(b.evs, buf)
	b.mu.Unlock()
}

func (b *bus) drainInto(t *testing.T, r *Router) {
	t.Helper()
	b.mu.Lock()
	evs := b.evs
	b.evs = nil
	b.mu.Unlock()
	for _, buf := range evs {
		var ev ReplicaEvent
		if err := ev.UnmarshalBinary(buf); err != nil {
			t.Fatal(err)
		}
		if err := r.ApplyReplicaEvent(ev); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReplicasConverge(t *testing.T) {
	var busA, busB bus
	mk := func(id string, b *bus, seed uint64) *Router {
		return newRouter(t, Config{Matcher: newFakeIndex(), RouterID: id, OnReplicaEvent: b.publish,
			Rand: rand.New(rand.NewPCG(seed, 0))}, 1, 2, 3)
	}
	a, b := mk("A", &busA, 1), mk("B", &busB, 2)
	rng := rand.New(rand.NewPCG(5, 5))
	var open []*Decision
	for i := 0; i < 300; i++ {
		r := a
		if rng.IntN(2) == 1 {
			r = b
		}
		switch op := rng.IntN(4); {
		case op < 2 || len(open) == 0:
			open = append(open, route(t, r, prompt(rng.IntN(6), 64+rng.IntN(400))))
		case op == 2:
			open[rng.IntN(len(open))].FirstToken()
		default:
			j := rng.IntN(len(open))
			open[j].Done()
			open = append(open[:j], open[j+1:]...)
		}
		if i%17 == 0 { // deliver in batches, as a bus would
			busA.drainInto(t, b)
			busB.drainInto(t, a)
		}
	}
	busA.drainInto(t, b)
	busB.drainInto(t, a)
	la, lb := a.Loads(), b.Loads()
	if !reflect.DeepEqual(la, lb) {
		t.Fatalf("replicas diverged:\nA %+v\nB %+v", la, lb)
	}
	var total int64
	for _, l := range la {
		total += l.ActiveRequests
	}
	if total != int64(len(open)) {
		t.Fatalf("replicas count %d active requests, %d are open", total, len(open))
	}
	// Each replica ignores its own echo.
	ev := ReplicaEvent{Kind: ReplicaAdd, Router: "A", Decision: "A-x", Worker: key(1), PrefillTokens: 10}
	if err := a.ApplyReplicaEvent(ev); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a.Loads(), la) {
		t.Fatal("own event applied")
	}
	for _, d := range open {
		d.Done()
	}
	busA.drainInto(t, b)
	busB.drainInto(t, a)
	for _, r := range []*Router{a, b} {
		for _, l := range r.Loads() {
			if l.ActiveRequests != 0 || l.ActiveBlocks != 0 || l.ActivePrefillTokens != 0 {
				t.Fatalf("%s: load left %+v", r.ID(), l)
			}
		}
	}
}

func TestReplicaLoadInfluencesRouting(t *testing.T) {
	var bb bus
	a := newRouter(t, Config{Matcher: newFakeIndex(), RouterID: "A"}, 1, 2)
	b := newRouter(t, Config{Matcher: newFakeIndex(), RouterID: "B", OnReplicaEvent: bb.publish}, 1, 2)
	heavy := route(t, b, prompt(1, 4096))
	bb.drainInto(t, a)
	for i := 0; i < 20; i++ {
		d := route(t, a, prompt(100+i, 64))
		if d.Worker == heavy.Worker {
			t.Fatal("replica A ignored B's load")
		}
		d.Done()
	}
	// Load for a worker A has not discovered yet is kept until it drains.
	unknown := ReplicaEvent{Kind: ReplicaAdd, Router: "B", Decision: "B-z", Worker: key(77), Blocks: []kv.SeqHash{1, 2}, PrefillTokens: 32}
	if err := a.ApplyReplicaEvent(unknown); err != nil {
		t.Fatal(err)
	}
	if l := a.Load(key(77)); l.ActiveBlocks != 2 {
		t.Fatalf("undiscovered worker load %+v", l)
	}
	if err := a.ApplyReplicaEvent(ReplicaEvent{Kind: ReplicaFree, Router: "B", Decision: "B-z", Worker: key(77)}); err != nil {
		t.Fatal(err)
	}
	if len(a.Loads()) != 2 {
		t.Fatalf("drained replica-only entry kept: %+v", a.Loads())
	}
}

func TestReplicaWire(t *testing.T) {
	evs := []ReplicaEvent{
		{Kind: ReplicaAdd, Router: "r1", Decision: "r1-1", Worker: kv.WorkerKey{Instance: 1 << 60, DPRank: 3},
			PrefillTokens: 8000, PrivateBlocks: 1, Blocks: []kv.SeqHash{1, 1 << 63, 42}},
		{Kind: ReplicaAdd, Router: "r1", Decision: "r1-2", Worker: key(2)},
		{Kind: ReplicaFirstToken, Router: "r1", Decision: "r1-1", Worker: key(2)},
		{Kind: ReplicaFree, Router: "r1", Decision: "r1-1", Worker: key(2)},
	}
	for _, ev := range evs {
		b, err := ev.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var got ReplicaEvent
		if err := got.UnmarshalBinary(b); err != nil {
			t.Fatalf("%v: %v", ev.Kind, err)
		}
		if !reflect.DeepEqual(got, ev) {
			t.Fatalf("round trip: %+v != %+v", got, ev)
		}
		// Every truncation is an error, never a panic.
		for n := 0; n < len(b); n++ {
			if err := got.UnmarshalBinary(b[:n]); err == nil {
				t.Fatalf("%v truncated to %d bytes decoded", ev.Kind, n)
			}
		}
		if err := got.UnmarshalBinary(append(bytes.Clone(b), 0)); err == nil {
			t.Fatal("trailing byte accepted")
		}
	}
	for name, ev := range map[string]ReplicaEvent{
		"no kind":        {Router: "r", Decision: "d"},
		"no router":      {Kind: ReplicaFree, Decision: "d"},
		"no decision":    {Kind: ReplicaFree, Router: "r"},
		"free with load": {Kind: ReplicaFree, Router: "r", Decision: "d", PrefillTokens: 3},
		"negative":       {Kind: ReplicaAdd, Router: "r", Decision: "d", PrefillTokens: -3},
	} {
		if _, err := ev.MarshalBinary(); err == nil {
			t.Errorf("%s: marshalled", name)
		}
		r := newRouter(t, Config{}, 1)
		if err := r.ApplyReplicaEvent(ev); !errors.Is(err, errReplica) {
			t.Errorf("%s: applied (%v)", name, err)
		}
	}
}

func FuzzReplicaEventDecode(f *testing.F) {
	ev := ReplicaEvent{Kind: ReplicaAdd, Router: "r1", Decision: "r1-1", Worker: key(5), PrefillTokens: 9, Blocks: []kv.SeqHash{7, 8}}
	b, _ := ev.MarshalBinary()
	f.Add(b)
	f.Add([]byte{1, 3, 1, 'a', 1, 'b', 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		var ev ReplicaEvent
		if err := ev.UnmarshalBinary(data); err != nil {
			return
		}
		again, err := ev.MarshalBinary()
		if err != nil {
			t.Fatalf("decoded event does not re-encode: %v", err)
		}
		var ev2 ReplicaEvent
		if err := ev2.UnmarshalBinary(again); err != nil || !reflect.DeepEqual(ev, ev2) {
			t.Fatalf("re-decode: %v %+v %+v", err, ev, ev2)
		}
		r := newRouter(t, Config{RouterID: "self"}, 1)
		if err := r.ApplyReplicaEvent(ev); err != nil {
			t.Fatalf("valid event rejected: %v", err)
		}
	})
}
