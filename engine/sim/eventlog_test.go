package sim

import (
	"reflect"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// An Insert into a full cache evicts one block per block it stores; the
// evictions move ahead of the chain, so the chain is one Stored event and
// the evictions one Removed event, and replaying them gives the pool.
func TestInsertUnderEvictionIsOneChain(t *testing.T) {
	cfg := testConfig() // 64 blocks of 4 tokens
	a := mustCore(t, cfg)
	prompt := make([]kv.Token, 40) // 10 full blocks
	for i := range prompt {
		prompt[i] = kv.Token(7*i + 1)
	}
	a.Add(req("a", prompt, 1), time.Time{})
	drain(a)

	bcfg := cfg
	bcfg.Worker = kv.WorkerKey{Instance: 99}
	b := mustCore(t, bcfg)
	h := newHoldings(t, bcfg.Worker, cfg.BlockSize)
	var batches [][]kv.Event
	b.SetEventSink(func(batch []kv.Event) { batches = append(batches, batch); h.sink(batch) })
	// Fill b's cache with other blocks, all idle (evictable).
	for i := 0; b.CachedBlocks() < cfg.Blocks; i++ {
		p := make([]kv.Token, 16*cfg.BlockSize)
		for j := range p {
			p[j] = kv.Token(1_000_000*(i+1) + j)
		}
		b.Add(req("fill", p, 1), time.Time{})
		drain(b)
	}
	batches = nil
	b.cfg.Fetcher = peerFetcher(a, cfg, -1)
	if _, err := b.Add(req("b", prompt, 1), time.Time{}); err != nil {
		t.Fatal(err)
	}
	if len(batches) != 1 {
		t.Fatalf("%d batches from one insert", len(batches))
	}
	ev := batches[0]
	if len(ev) != 2 || ev[0].Kind != kv.EventRemoved || len(ev[0].Removed) != 10 ||
		ev[1].Kind != kv.EventStored || len(ev[1].Blocks) != 10 || ev[1].HasParent {
		for _, e := range ev {
			t.Logf("%v: %d removed, %d stored", e.Kind, len(e.Removed), len(e.Blocks))
		}
		t.Fatalf("%d events, want Removed(10) then Stored(10)", len(ev))
	}
	if err := h.matches(b); err != nil {
		t.Fatal(err)
	}
	drain(b)
	if err := h.matches(b); err != nil {
		t.Fatal(err)
	}
}

// An eviction moves ahead of the open Stored run only when it commutes
// with it: not one of the run's blocks, not its parent.
func TestEventLogHoist(t *testing.T) {
	var got []kv.Event
	l := eventLog{sink: func(b []kv.Event) { got = append(got, b...) }, worker: kv.WorkerKey{Instance: 1}}
	kinds := func() (s string) {
		for _, e := range got {
			switch e.Kind {
			case kv.EventStored:
				s += "S"
			case kv.EventRemoved:
				s += "R"
			}
			for range max(len(e.Blocks), len(e.Removed)) {
				s += "."
			}
		}
		return s
	}
	// R S R S R S over one chain: R... S...
	l.removed(100)
	l.stored(0, true, 1, 11, nil, "", "")
	l.removed(101)
	l.stored(1, true, 2, 12, nil, "", "")
	l.removed(102)
	l.stored(2, true, 3, 13, nil, "", "")
	l.flush()
	if k := kinds(); k != "R...S..." {
		t.Fatalf("alternating chain became %s", k)
	}
	if r := got[0].Removed; r[0] != 100 || r[1] != 101 || r[2] != 102 || got[1].Parent != 0 || !got[1].HasParent {
		t.Fatalf("events %+v", got)
	}
	for i, e := range got {
		if e.ID != uint64(i+1) {
			t.Fatalf("event %d has id %d", i, e.ID)
		}
	}
	// Evicting the run's own block or its parent keeps the order; a later
	// eviction that commutes with the next run joins the Removed before it.
	got = nil
	l.stored(5, true, 6, 16, nil, "", "")
	l.stored(6, true, 7, 17, nil, "", "")
	l.removed(6) // in the run: closes it
	l.stored(7, true, 8, 18, nil, "", "")
	l.removed(5) // commutes with storing 8
	l.stored(8, true, 9, 19, nil, "", "")
	l.removed(8) // the run's parent... and its block: stays after
	l.flush()
	if k := kinds(); k != "S..R..S..R." {
		t.Fatalf("evictions reordered wrongly: %s", k)
	}
	if r := got[1].Removed; len(r) != 2 || r[0] != 6 || r[1] != 5 {
		t.Fatalf("removed %v, want [6 5]", r)
	}
	got = nil
	l.stored(30, true, 31, 31, nil, "", "")
	l.removed(30) // the run's parent
	l.flush()
	if k := kinds(); k != "S.R." {
		t.Fatalf("evicting the parent reordered: %s", k)
	}
	// A run with no Removed event before it starts one.
	got = nil
	l.stored(0, false, 20, 20, nil, "", "")
	l.removed(99)
	l.removed(98)
	l.stored(20, true, 21, 21, nil, "", "")
	l.flush()
	if k := kinds(); k != "R..S.." || got[0].ID+1 != got[1].ID {
		t.Fatalf("events %s %+v", k, got)
	}
}

// A transient sink sees exactly the events a keeping sink sees, in slices
// the core reuses from one flush to the next.
func TestTransientSinkSameEventsReused(t *testing.T) {
	cfg := testConfig()
	cfg.Blocks = 24 // tight: evictions and preemptions
	keep, reuse := mustCore(t, cfg), mustCore(t, cfg)
	var kept, copied [][]kv.Event
	keep.SetEventSink(func(batch []kv.Event) { kept = append(kept, batch) })
	deep := func(batch []kv.Event) []kv.Event {
		out := make([]kv.Event, len(batch))
		for i, e := range batch {
			e.Blocks = append([]kv.StoredBlock(nil), e.Blocks...)
			e.Removed = append([]kv.EngineHash(nil), e.Removed...)
			e.Tokens = append([]kv.Token(nil), e.Tokens...)
			out[i] = e
		}
		return out
	}
	var firsts []*kv.Event
	reuse.SetTransientEventSink(func(batch []kv.Event) {
		copied = append(copied, deep(batch))
		firsts = append(firsts, &batch[0])
	})
	now := time.Time{}
	for i := 0; i < 40; i++ {
		p := make([]kv.Token, 6+i%5*7)
		for j := range p {
			p[j] = kv.Token((i%6)*1000 + j) // six prompts sharing nothing, repeated
		}
		for _, c := range []*Core{keep, reuse} {
			if _, err := c.Add(req("r", p, 1+i%4), now); err != nil {
				t.Fatal(err)
			}
		}
		for range 3 {
			now = keep.Step(now).End
			reuse.Step(now)
		}
	}
	for !keep.Idle() {
		now = keep.Step(now).End
		reuse.Step(now)
	}
	if len(kept) != len(copied) || len(kept) < 10 {
		t.Fatalf("%d batches kept, %d transient", len(kept), len(copied))
	}
	for i := range kept {
		if !reflect.DeepEqual(deep(kept[i]), copied[i]) {
			t.Fatalf("batch %d: kept %+v, transient %+v", i, kept[i], copied[i])
		}
	}
	reused := 0
	for i := 1; i < len(firsts); i++ {
		if firsts[i] == firsts[i-1] {
			reused++
		}
	}
	if reused == 0 {
		t.Fatal("the transient sink never got a reused batch")
	}
}
