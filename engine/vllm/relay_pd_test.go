package vllm

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/enginetest"
	"github.com/kvmesh/kvmesh/engine/remote"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/mockengine"
)

type sink struct {
	mu     sync.Mutex
	stored map[kv.LocalHash]kv.EngineHash
}

func (s *sink) fn(b []kv.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range b {
		for _, blk := range e.Blocks {
			s.stored[blk.LocalHash] = blk.EngineHash
		}
	}
}

func (s *sink) has(hs []kv.LocalHash) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range hs {
		if _, ok := s.stored[h]; !ok {
			return false
		}
	}
	return true
}

// TestEventsRelayedWithCatchUp: events published before the worker
// listened arrive through replay, later ones live; local hashes are
// kvmesh's own, recomputed from the events' token ids.
func TestEventsRelayedWithCatchUp(t *testing.T) {
	v, srv := startMock(t, mockOpts{events: true})
	e := newEngine(t, Config{Config: remote.Config{URL: srv.URL, Events: v.EventsEndpoint(0), ReplayEvents: v.ReplayEndpoint(0)}})
	gen := func(p []kv.Token) {
		ch, err := e.Generate(context.Background(), &engine.Request{Tokens: p, Sampling: kv.Sampling{MaxTokens: 1}})
		if err != nil {
			t.Fatal(err)
		}
		enginetest.Collect(t, ch)
	}
	early, late := enginetest.Prompt(48, 1000), enginetest.Prompt(48, 5000)
	gen(early)
	s := &sink{stored: map[kv.LocalHash]kv.EngineHash{}}
	e.SetEventSink(s.fn)
	// The first live batch the subscriber gets (a PUB drops what it
	// sends before the SUB has joined) shows it what it missed; replay
	// supplies that.
	want := kv.LocalHashes(nil, early, 16, kv.Seed("", ""))
	i := kv.Token(0)
	testutil.WaitFor(t, 5*time.Second, "the early prompt's blocks through replay", func() bool {
		i++
		gen(enginetest.Prompt(16, 20000+16*i))
		return s.has(want)
	})
	gen(late)
	want = kv.LocalHashes(nil, late, 16, kv.Seed("", ""))
	testutil.WaitFor(t, 5*time.Second, "the late prompt's blocks live", func() bool { return s.has(want) })
	if st := e.Relay().Stats(); st.Replayed == 0 || st.Lost != 0 {
		t.Fatalf("relay stats %+v", st)
	}
}

// TestWarmEngineIndexedAtStart: an adapter attached to an engine that
// already holds blocks and then goes idle relays them at once, through the
// replay socket, with no further request to the engine.
func TestWarmEngineIndexedAtStart(t *testing.T) {
	v, srv := startMock(t, mockOpts{events: true})
	warm := enginetest.Prompt(64, 3000)
	pre := newEngine(t, Config{Config: remote.Config{URL: srv.URL}})
	ch, err := pre.Generate(context.Background(), &engine.Request{Tokens: warm, Sampling: kv.Sampling{MaxTokens: 1}})
	if err != nil {
		t.Fatal(err)
	}
	enginetest.Collect(t, ch)
	e := newEngine(t, Config{Config: remote.Config{URL: srv.URL, Events: v.EventsEndpoint(0), ReplayEvents: v.ReplayEndpoint(0)}})
	s := &sink{stored: map[kv.LocalHash]kv.EngineHash{}}
	e.SetEventSink(s.fn)
	want := kv.LocalHashes(nil, warm, 16, kv.Seed("", ""))
	testutil.WaitFor(t, 5*time.Second, "the warm engine's blocks", func() bool { return s.has(want) })
	if st := e.Relay().Stats(); st.Replayed == 0 || st.Lost != 0 || st.Gaps != 0 {
		t.Fatalf("relay stats %+v", st)
	}
}

// TestPrefillThenDecodeAcrossMocks: the prefill leg's answer, carried
// whole to a second mock's decode leg, makes it pull the blocks over the
// side channel and notify the producer, which frees them.
func TestPrefillThenDecodeAcrossMocks(t *testing.T) {
	pm, psrv := startMock(t, mockOpts{role: mockengine.RoleProducer})
	dm, dsrv := startMock(t, mockOpts{role: mockengine.RoleConsumer})
	pe := newEngine(t, Config{Config: remote.Config{URL: psrv.URL, Role: kv.RolePrefill}})
	de := newEngine(t, Config{Config: remote.Config{URL: dsrv.URL, Role: kv.RoleDecode}})
	p := enginetest.Prompt(70, 300)
	ch, err := pe.Generate(context.Background(), &engine.Request{ID: "pd-1", Tokens: p, Leg: kv.LegPrefill, Sampling: kv.Sampling{MaxTokens: 20}})
	if err != nil {
		t.Fatal(err)
	}
	_, last, _ := enginetest.Collect(t, ch)
	if last.Finish != kv.FinishLength || len(last.TransferParams) == 0 || last.Usage.CompletionTokens != 1 {
		t.Fatalf("prefill answer %+v", last)
	}
	if ls := pm.LeaseStats(0); ls.Blocks == 0 {
		t.Fatalf("producer leases %+v", ls)
	}
	ch, err = de.Generate(context.Background(), &engine.Request{ID: "pd-1", Tokens: p, Leg: kv.LegDecode, TransferParams: last.TransferParams,
		Sampling: kv.Sampling{MaxTokens: 20}})
	if err != nil {
		t.Fatal(err)
	}
	toks, dl, _ := enginetest.Collect(t, ch)
	if len(toks) != 20 || dl.Finish != kv.FinishLength || dl.Usage.CachedTokens != 64 {
		t.Fatalf("decode: %d tokens, last %+v", len(toks), dl)
	}
	if ps := dm.PullStats(); ps.OK != 1 || ps.Blocks != 4 {
		t.Fatalf("pulls %+v", ps)
	}
	testutil.WaitFor(t, 10*time.Second, "the producer frees the blocks", func() bool { return pm.LeaseStats(0).Blocks == 0 })
}
