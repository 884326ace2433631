package remote

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/events"
	"github.com/kvmesh/kvmesh/kv"
)

type sinkLog struct {
	mu  sync.Mutex
	evs []kv.Event
}

func (s *sinkLog) sink(b []kv.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evs = append(s.evs, b...)
}

// logBuf captures log lines.
type logBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

func storeBatch(t *testing.T, hashes []kv.EngineHash, tokens []kv.Token, blockSize int) []byte {
	t.Helper()
	p, err := events.EncodeBatch(&events.Batch{TS: 1, Events: []events.Event{{Type: events.TypeStored, BlockHashes: hashes,
		TokenIDs: tokens, BlockSize: blockSize, Medium: "GPU", HasMedium: true}}}, events.ShapeMap)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func toks(n int, base kv.Token) []kv.Token {
	out := make([]kv.Token, n)
	for i := range out {
		out[i] = base + kv.Token(i)
	}
	return out
}

// newTestRelay is a relay whose rank-1 subscriber the test feeds through
// Ingest (no socket; no replay endpoint, so a gap is lost at once).
func newTestRelay(t *testing.T, logs *logBuf) (*Relay, *sinkLog) {
	t.Helper()
	r, err := NewRelay(RelayConfig{Endpoint: "tcp://127.0.0.1:1", DPSize: 2, BlockSize: 4,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	s := &sinkLog{}
	var sink engine.EventSink = s.sink
	r.feed.sink.Store(&sink) // installed without starting the subscribers
	return r, s
}

func TestRelayComputesLocalHashesAndRanks(t *testing.T) {
	r, s := newTestRelay(t, &logBuf{})
	tk := toks(8, 100)
	r.subs[1].Ingest(context.Background(), 0, storeBatch(t, []kv.EngineHash{7, 8}, tk, 4))
	if len(s.evs) != 1 {
		t.Fatalf("events %+v", s.evs)
	}
	ev := s.evs[0]
	want := kv.LocalHashes(nil, tk, 4, kv.Seed("", ""))
	if ev.Kind != kv.EventStored || ev.Worker.DPRank != 1 || len(ev.Blocks) != 2 ||
		ev.Blocks[0].LocalHash != want[0] || ev.Blocks[1].LocalHash != want[1] || ev.Blocks[1].EngineHash != 8 {
		t.Fatalf("event %+v, want local hashes %v", ev, want)
	}
}

func TestRelayLostBatchesClearTheRank(t *testing.T) {
	logs := &logBuf{}
	r, s := newTestRelay(t, logs)
	ctx := context.Background()
	sub := r.subs[1]
	sub.Ingest(ctx, 0, storeBatch(t, []kv.EngineHash{1}, toks(4, 1), 4))
	sub.Ingest(ctx, 3, storeBatch(t, []kv.EngineHash{2}, toks(4, 2), 4)) // 1 and 2 are gone
	sub.Ingest(ctx, 9, storeBatch(t, []kv.EngineHash{3}, toks(4, 3), 4)) // and 4..8
	var kinds []kv.EventKind
	for _, e := range s.evs {
		if e.Worker.DPRank != 1 {
			t.Fatalf("rank %d", e.Worker.DPRank)
		}
		kinds = append(kinds, e.Kind)
	}
	want := []kv.EventKind{kv.EventStored, kv.EventCleared, kv.EventStored, kv.EventCleared, kv.EventStored}
	if len(kinds) != len(want) {
		t.Fatalf("kinds %v, want %v", kinds, want)
	}
	for i := range want {
		if kinds[i] != want[i] {
			t.Fatalf("kinds %v, want %v", kinds, want)
		}
	}
	if st := r.Stats(); st.Cleared != 2 || st.Lost != 7 {
		t.Fatalf("stats %+v", st)
	}
	if n := logs.count("lost beyond replay"); n != 1 {
		t.Fatalf("loss logged %d times", n)
	}
}

func TestRelayBlockSizeMismatchIsOneError(t *testing.T) {
	logs := &logBuf{}
	r, s := newTestRelay(t, logs)
	ctx := context.Background()
	for seq := range uint64(3) {
		r.subs[0].Ingest(ctx, seq, storeBatch(t, []kv.EngineHash{kv.EngineHash(seq + 1)}, toks(8, 1), 8))
	}
	if len(s.evs) != 0 {
		t.Fatalf("stores of another block size delivered: %+v", s.evs)
	}
	if st := r.Stats(); st.BlockSizeMismatches != 3 {
		t.Fatalf("stats %+v", st)
	}
	if n := logs.count("engine_block_size=8 block_size=4"); n != 1 {
		t.Fatalf("mismatch logged %d times:\n%s", n, logs.b.String())
	}
}

func removeBatch(t *testing.T, hashes []kv.EngineHash) []byte {
	t.Helper()
	p, err := events.EncodeBatch(&events.Batch{TS: 1, Events: []events.Event{{Type: events.TypeRemoved, BlockHashes: hashes,
		Medium: "GPU", HasMedium: true}}}, events.ShapeMap)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// A remote engine cannot list its cache: the relay's inventory is what
// the relayed events built, so the worker's dump gives the router the
// blocks stored before it looked (vLLM's replay at first subscription).
func TestRelayInventoryIsWhatItsEventsBuilt(t *testing.T) {
	r, s := newTestRelay(t, &logBuf{})
	ctx := context.Background()
	sub := r.subs[1]
	sub.Ingest(ctx, 0, storeBatch(t, []kv.EngineHash{7, 8}, toks(8, 100), 4))
	child := events.Event{Type: events.TypeStored, BlockHashes: []kv.EngineHash{9}, Parent: 8, HasParent: true,
		TokenIDs: toks(4, 200), BlockSize: 4, Medium: "GPU", HasMedium: true}
	p, err := events.EncodeBatch(&events.Batch{TS: 1, Events: []events.Event{child}}, events.ShapeMap)
	if err != nil {
		t.Fatal(err)
	}
	sub.Ingest(ctx, 1, p)
	sub.Ingest(ctx, 2, removeBatch(t, []kv.EngineHash{7}))
	local := map[kv.EngineHash]kv.LocalHash{}
	for _, e := range s.evs {
		for _, b := range e.Blocks {
			local[b.EngineHash] = b.LocalHash
		}
	}
	marks := 0
	inv, ok := r.Inventory(1, func() { marks++ })
	if !ok || marks != 1 {
		t.Fatalf("inventory ok %v, marked %d times", ok, marks)
	}
	// 8 stays under 7, as the events left it; 9 follows its parent.
	type held struct {
		hash, parent kv.EngineHash
		hasParent    bool
	}
	want := []held{{8, 7, true}, {9, 8, true}}
	var got []held
	for _, e := range inv {
		if e.Kind != kv.EventStored || e.Tier != kv.TierDevice || e.Worker.DPRank != 1 || len(e.Blocks) != 1 ||
			e.Blocks[0].LocalHash != local[e.Blocks[0].EngineHash] {
			t.Fatalf("inventory event %+v (local hashes %v)", e, local)
		}
		got = append(got, held{e.Blocks[0].EngineHash, e.Parent, e.HasParent})
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("inventory %v, want %v", got, want)
	}
	if inv, ok := r.Inventory(0, nil); !ok || len(inv) != 0 {
		t.Fatalf("rank 0 holds %v (%v)", inv, ok)
	}
	if _, ok := r.Inventory(2, nil); ok {
		t.Fatal("rank 2 of a 2-rank relay listed")
	}
	// Batches lost beyond replay clear the rank: so does its inventory.
	sub.Ingest(ctx, 9, storeBatch(t, []kv.EngineHash{11}, toks(4, 300), 4))
	if inv, _ := r.Inventory(1, nil); len(inv) != 1 || inv[0].Blocks[0].EngineHash != 11 || inv[0].HasParent {
		t.Fatalf("after a loss: %+v", inv)
	}
}

func TestRankHoldingsListParentsFirst(t *testing.T) {
	h := newRankHoldings()
	w := kv.WorkerKey{}
	p := kv.EngineHash(1)
	h.apply([]kv.Event{kv.Stored(w, kv.TierDevice, nil, []kv.StoredBlock{{EngineHash: 1}}),
		kv.Stored(w, kv.TierDevice, &p, []kv.StoredBlock{{EngineHash: 2}}),
		kv.Removed(w, kv.TierDevice, []kv.EngineHash{1}),
		kv.Stored(w, kv.TierDevice, nil, []kv.StoredBlock{{EngineHash: 1}})}) // the parent again, after its child
	var order []kv.EngineHash
	for _, e := range h.list(w) {
		order = append(order, e.Blocks[0].EngineHash)
	}
	if fmt.Sprint(order) != "[1 2]" {
		t.Fatalf("listed %v, want the parent first", order)
	}
}
