package events

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"go.uber.org/goleak"

	"github.com/kvmesh/kvmesh/kv"
)

func newTestPublisher(t *testing.T, replay bool) *Publisher {
	t.Helper()
	cfg := PublisherConfig{Endpoint: "tcp://127.0.0.1:0", BlockSize: 4, Logger: quietLogger()}
	if replay {
		cfg.ReplayEndpoint = "tcp://127.0.0.1:0"
	}
	p, err := NewPublisher(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// checkContiguous asserts deliveries carry seqs 0, 1, 2, … exactly once.
func checkContiguous(t *testing.T, dels []Delivery) {
	t.Helper()
	for i, d := range dels {
		if d.Seq != uint64(i) {
			var seqs []uint64
			for _, d := range dels {
				seqs = append(seqs, d.Seq)
			}
			t.Fatalf("delivery %d has seq %d; all: %v", i, d.Seq, seqs)
		}
	}
}

func TestGapRepairedThroughReplay(t *testing.T) {
	defer goleak.VerifyNone(t, leakOpts...)
	p := newTestPublisher(t, true)
	defer p.Close()
	// Live copies of batches 1, 2 and 4 never leave; corrupt 6 on the wire.
	p.liveFrame = func(seq uint64, payload []byte) []byte {
		switch seq {
		case 1, 2, 4:
			return nil
		case 6:
			return []byte{0x93, 0xcb}
		}
		return payload
	}
	sub, c, stop := runSub(t, Config{Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(), Instance: 42, BlockSize: 4})
	in := simEvents(4)
	for i := range in {
		if err := p.Publish(in[i : i+1]); err != nil {
			t.Fatal(err)
		}
	}
	tickUntil(t, p, func() bool { evs, _ := c.snapshot(); return len(evs) >= len(in) })
	stop()
	got, dels := c.snapshot()
	checkContiguous(t, dels)
	if !reflect.DeepEqual(got, in) {
		t.Fatalf("events differ:\n got %+v\nwant %+v", got, in)
	}
	st := sub.Stats()
	if st.Replayed < 3 || st.Lost != 0 || st.ReplayErrors != 0 {
		t.Fatalf("stats %+v", st)
	}
	// Batch 6 can only be missed as a corrupt live copy if the subscriber
	// was already listening; when it was, it counts as malformed.
	if st.Malformed > 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestLateJoinReplaysWhatTheRingHolds(t *testing.T) {
	defer goleak.VerifyNone(t, leakOpts...)
	p, err := NewPublisher(context.Background(), PublisherConfig{Endpoint: "tcp://127.0.0.1:0",
		ReplayEndpoint: "tcp://127.0.0.1:0", BufferSteps: 3, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := range 10 {
		if _, err := p.PublishBatch(&Batch{TS: float64(i), Events: []Event{{Type: TypeCleared}}}); err != nil {
			t.Fatal(err)
		}
	}
	sub, c, stop := runSub(t, Config{Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint()})
	tickUntil(t, p, func() bool { _, d := c.snapshot(); return len(d) > 0 })
	stop()
	_, dels := c.snapshot()
	// The ring's oldest batch (7, or later if ticks pushed it out) comes
	// first, then everything after it in order.
	if dels[0].Seq < 7 || !dels[0].Replayed {
		t.Fatalf("first delivery %+v", dels[0])
	}
	for i := 1; i < len(dels); i++ {
		if dels[i].Seq != dels[i-1].Seq+1 {
			t.Fatalf("delivery %d seq %d after %d", i, dels[i].Seq, dels[i-1].Seq)
		}
	}
	if st := sub.Stats(); st.Lost != 0 || st.Gaps != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestIdleWarmPublisherReplayedAtStart: a subscriber that joins a
// publisher which already published and then went quiet gets the ring's
// batches at once, without waiting for a live one.
func TestIdleWarmPublisherReplayedAtStart(t *testing.T) {
	defer goleak.VerifyNone(t, leakOpts...)
	p := newTestPublisher(t, true)
	defer p.Close()
	in := simEvents(4)
	for i := range in {
		if err := p.Publish(in[i : i+1]); err != nil {
			t.Fatal(err)
		}
	}
	sub, c, stop := runSub(t, Config{Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(), Instance: 42, BlockSize: 4})
	deadline := time.Now().Add(5 * time.Second)
	for evs, _ := c.snapshot(); len(evs) < len(in); evs, _ = c.snapshot() {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events without a live batch", len(evs), len(in))
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	got, dels := c.snapshot()
	checkContiguous(t, dels)
	if !reflect.DeepEqual(got, in) {
		t.Fatalf("events differ:\n got %+v\nwant %+v", got, in)
	}
	if st := sub.Stats(); st.Replayed != uint64(len(dels)) || st.Gaps != 0 || st.Lost != 0 || st.ReplayRequests != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestBadInputSkippedAndCounted(t *testing.T) {
	defer goleak.VerifyNone(t, leakOpts...)
	p := newTestPublisher(t, true)
	defer p.Close()
	sub, c, stop := runSub(t, Config{Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(), Instance: 1, BlockSize: 4})
	// Wait until the subscriber is live, so what follows is received.
	tickUntil(t, p, func() bool { _, d := c.snapshot(); return len(d) > 0 })
	send := func(frames ...[]byte) {
		if err := p.pub.SendMulti(zmq4.NewMsgFrom(frames...)); err != nil {
			t.Fatal(err)
		}
	}
	send([]byte(""), []byte{1})                                       // two frames
	send([]byte(""), []byte{0, 0, 0, 0, 0, 0, 0, 0, 1}, []byte{0x90}) // 9-byte seq
	// A batch that is garbage in the ring too: skipped, the stream goes on.
	p.mu.Lock()
	_, err := p.publishLocked([]byte{0xdd, 0x7f, 0xff, 0xff, 0xff})
	p.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	// An unknown event tag next to a good one.
	if _, err := p.PublishBatch(&Batch{Events: []Event{{Type: TypeCleared}}, HasDPRank: true, DPRank: 3}); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	_, err = p.publishLocked(pack(t, []any{1.0, []any{[]any{"BlockMoved", 1}, []any{"AllBlocksCleared"}}, 3}))
	p.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	tickUntil(t, p, func() bool {
		st := sub.Stats()
		return st.BadFrames >= 2 && st.UnknownEvents >= 1
	})
	stop()
	st := sub.Stats()
	if st.BadFrames != 2 || st.Malformed != 2 || st.UnknownEvents != 1 {
		t.Fatalf("stats %+v", st)
	}
	evs, _ := c.snapshot()
	var cleared int
	for _, e := range evs {
		if e.Kind == kv.EventCleared && e.Worker == (kv.WorkerKey{Instance: 1, DPRank: 3}) {
			cleared++
		}
	}
	if cleared != 2 {
		t.Fatalf("want 2 clears on rank 3, got %d in %+v", cleared, evs)
	}
}

func TestGapWithoutReplayIsCountedLost(t *testing.T) {
	defer goleak.VerifyNone(t, leakOpts...)
	p := newTestPublisher(t, false)
	defer p.Close()
	sub, c, stop := runSub(t, Config{Endpoint: p.Endpoint(), Instance: 1, BlockSize: 4})
	tickUntil(t, p, func() bool { _, d := c.snapshot(); return len(d) > 0 })
	p.liveFrame = func(seq uint64, payload []byte) []byte { return nil }
	for range 3 {
		if _, err := p.PublishBatch(&Batch{Events: []Event{}}); err != nil {
			t.Fatal(err)
		}
	}
	p.mu.Lock()
	p.liveFrame = nil
	p.mu.Unlock()
	tickUntil(t, p, func() bool { return sub.Stats().Lost > 0 })
	stop()
	if st := sub.Stats(); st.Lost != 3 || st.Gaps != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestReplayUnreachable(t *testing.T) {
	defer goleak.VerifyNone(t, leakOpts...)
	c := &collector{}
	s, err := NewSubscriber(Config{Endpoint: "tcp://127.0.0.1:1", ReplayEndpoint: "tcp://127.0.0.1:1",
		ReplayTimeout: 200 * time.Millisecond, Handler: c.handle, Logger: quietLogger(), BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	payload, _ := EncodeBatch(&Batch{Events: []Event{{Type: TypeCleared}}}, ShapeArray)
	ctx := context.Background()
	s.Ingest(ctx, 5, payload) // joining: what came before is not a loss
	s.Ingest(ctx, 6, payload)
	s.Ingest(ctx, 9, payload) // a gap the dead replay socket cannot fill
	st := s.Stats()
	if st.ReplayErrors != 2 || st.Lost != 2 || st.Gaps != 1 || st.Batches != 3 {
		t.Fatalf("stats %+v", st)
	}
}

func TestRestartClearsAndResyncs(t *testing.T) {
	c := &collector{}
	s, err := NewSubscriber(Config{Endpoint: "tcp://127.0.0.1:1", Instance: 9, Handler: c.handle, Logger: quietLogger(), BlockSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	store, _ := EncodeBatch(&Batch{HasDPRank: true, DPRank: 1, Events: []Event{{Type: TypeStored, BlockHashes: []kv.EngineHash{1}, TokenIDs: []uint32{5, 6}}}}, ShapeArray)
	ctx := context.Background()
	s.Ingest(ctx, 0, store)
	s.Ingest(ctx, 1, store)
	s.Ingest(ctx, 0, store) // the engine came back
	evs, dels := c.snapshot()
	if st := s.Stats(); st.Restarts != 1 || st.Batches != 3 {
		t.Fatalf("stats %+v", st)
	}
	if len(dels) != 4 || dels[2].Batch != nil || len(evs) != 4 || evs[2].Kind != kv.EventCleared ||
		evs[2].Worker != (kv.WorkerKey{Instance: 9, DPRank: 1}) {
		t.Fatalf("deliveries %+v", dels)
	}
	for i, e := range evs {
		if e.ID != uint64(i+1) {
			t.Fatalf("event %d has id %d", i, e.ID)
		}
	}
	want := kv.StoredBlock{EngineHash: 1, LocalHash: kv.HashTokens([]kv.Token{5, 6}, kv.BaseSeed)}
	if !reflect.DeepEqual(evs[3].Blocks, []kv.StoredBlock{want}) {
		t.Fatalf("blocks %+v", evs[3].Blocks)
	}
}

func TestConvert(t *testing.T) {
	w := kv.WorkerKey{Instance: 7, DPRank: 2}
	c := Converter{Instance: 7, BlockSize: 2}
	salted := kv.Seed("lora-a", "salt-1")
	b := &Batch{HasDPRank: true, DPRank: 2, Events: []Event{
		// Short: three hashes, five tokens: two blocks survive.
		{Type: TypeStored, BlockHashes: []kv.EngineHash{1, 2, 3}, TokenIDs: []uint32{1, 2, 3, 4, 5}, BlockSize: 2,
			Medium: "cpu", HasMedium: true, LoRAName: "lora-a", HasLoRAName: true, CacheSalt: "salt-1"},
		{Type: TypeStored, BlockHashes: []kv.EngineHash{4}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 4},         // block size mismatch
		{Type: TypeStored, BlockHashes: []kv.EngineHash{5, 5}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2},      // duplicate hash
		{Type: TypeStored, BlockHashes: []kv.EngineHash{6}, Parent: 6, HasParent: true, TokenIDs: []uint32{1, 2}}, // parent = child
		{Type: TypeStored, BlockHashes: []kv.EngineHash{8}, TokenIDs: []uint32{1, 2}, Medium: "TAPE", HasMedium: true},
		{Type: TypeRemoved, BlockHashes: []kv.EngineHash{9}, Medium: "NVME", HasMedium: true},
		{Type: TypeRemoved, BlockHashes: []kv.EngineHash{9}, Locality: "REMOTE", Medium: "DISK", HasMedium: true},
		{Type: TypeRemoved},
		{Type: TypeCleared},
	}}
	got := c.Convert(nil, b)
	stored := kv.Stored(w, kv.TierHost, nil, []kv.StoredBlock{
		{EngineHash: 1, LocalHash: kv.HashTokens([]kv.Token{1, 2}, salted)},
		{EngineHash: 2, LocalHash: kv.HashTokens([]kv.Token{3, 4}, salted)}})
	stored.ID, stored.Tokens, stored.LoRA, stored.Salt = 1, []kv.Token{1, 2, 3, 4}, "lora-a", "salt-1"
	removed := kv.Removed(w, kv.TierDisk, []kv.EngineHash{9})
	removed.ID = 2
	cleared := kv.Cleared(w)
	cleared.ID = 3
	if want := []kv.Event{stored, removed, cleared}; !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
	if c.Stats.Dropped != 6 || c.Stats.Truncated != 2 {
		t.Fatalf("stats %+v", c.Stats)
	}
	// Block size 0 trusts the wire.
	c0 := Converter{}
	if evs := c0.Convert(nil, &Batch{Events: []Event{{Type: TypeStored, BlockHashes: []kv.EngineHash{1}, TokenIDs: []uint32{1, 2, 3}, BlockSize: 3}}}); len(evs) != 1 || len(evs[0].Blocks) != 1 {
		t.Fatalf("got %+v", evs)
	}
}

// TestConvertSaltInheritance: vLLM names the salt on a request's first block
// only; stores continuing a salted chain take the salt of their parent
// until that parent is removed from every tier or the worker clears.
func TestConvertSaltInheritance(t *testing.T) {
	c := Converter{Instance: 1, BlockSize: 2}
	st := func(h, parent uint64, hasParent bool, medium, salt string) Event {
		return Event{Type: TypeStored, BlockHashes: []kv.EngineHash{kv.EngineHash(h)}, Parent: kv.EngineHash(parent), HasParent: hasParent,
			TokenIDs: []uint32{uint32(h), 1}, BlockSize: 2, Medium: medium, HasMedium: true, CacheSalt: salt}
	}
	rm := func(h uint64, medium string) Event {
		return Event{Type: TypeRemoved, BlockHashes: []kv.EngineHash{kv.EngineHash(h)}, Medium: medium, HasMedium: true}
	}
	check := func(evs []Event, wantSalts ...string) {
		t.Helper()
		got := c.Convert(nil, &Batch{Events: evs})
		var salts []string
		for _, e := range got {
			if e.Kind != kv.EventStored {
				continue
			}
			salts = append(salts, e.Salt)
			want := kv.HashTokens(e.Tokens, kv.Seed("", e.Salt))
			if e.Blocks[0].LocalHash != want {
				t.Fatalf("block %d: local %x, want %x (salt %q)", e.Blocks[0].EngineHash, e.Blocks[0].LocalHash, want, e.Salt)
			}
		}
		if !reflect.DeepEqual(salts, wantSalts) {
			t.Fatalf("salts %q, want %q", salts, wantSalts)
		}
	}
	check([]Event{st(10, 0, false, "GPU", "s"), st(11, 10, true, "GPU", ""), st(12, 11, true, "GPU", ""),
		st(20, 0, false, "GPU", ""), st(21, 20, true, "GPU", "")}, "s", "s", "s", "", "")
	// 11 offloaded to CPU, then evicted from GPU: the CPU copy still names it.
	check([]Event{st(11, 10, true, "CPU", ""), rm(11, "GPU"), st(13, 11, true, "CPU", "")}, "s", "s")
	check([]Event{rm(11, "CPU"), st(14, 11, true, "GPU", "")}, "")
	// An explicit salt wins over the parent's.
	check([]Event{st(15, 12, true, "GPU", "t")}, "t")
	check([]Event{{Type: TypeCleared}, st(16, 12, true, "GPU", "")}, "")
	if len(c.salted) != 0 || c.Stats.SaltUntracked != 0 {
		t.Fatalf("after clear: %d salted blocks remembered, stats %+v", len(c.salted), c.Stats)
	}
}

func TestEndpoints(t *testing.T) {
	for ep, want := range map[string]bool{"tcp://*:5557": true, "tcp://[::]:5557": true, "ipc:///tmp/x": true,
		"inproc://kv": true, "tcp://127.0.0.1:0": true, "tcp://10.0.0.1:5557": false} {
		if ShouldBind(ep) != want {
			t.Errorf("ShouldBind(%q) = %v", ep, !want)
		}
	}
	for _, tc := range [][3]any{{"tcp://*:5557", 2, "tcp://*:5559"}, {"inproc://kv", 1, "inproc://kv_dp1"},
		{"tcp://10.0.0.1:5557", 0, "tcp://10.0.0.1:5557"}, {"ipc:///tmp/x", 3, "ipc:///tmp/x"}} {
		got, err := RankEndpoint(tc[0].(string), tc[1].(int))
		if err != nil || got != tc[2] {
			t.Errorf("RankEndpoint(%v, %v) = %q, %v", tc[0], tc[1], got, err)
		}
	}
	if _, err := RankEndpoint("tcp://h:65535", 1); err == nil {
		t.Error("port overflow accepted")
	}
}

func TestReplayOverlapIsDeduplicated(t *testing.T) {
	defer goleak.VerifyNone(t, leakOpts...)
	p := newTestPublisher(t, true)
	defer p.Close()
	var payloads [][]byte
	for i := range 5 {
		b := &Batch{TS: float64(i), Events: []Event{{Type: TypeRemoved, BlockHashes: []kv.EngineHash{kv.EngineHash(i)}}}}
		if _, err := p.PublishBatch(b); err != nil {
			t.Fatal(err)
		}
		enc, _ := EncodeBatch(b, ShapeArray)
		payloads = append(payloads, enc)
	}
	c := &collector{}
	s, err := NewSubscriber(Config{Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(), Handler: c.handle, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s.Ingest(ctx, 2, payloads[2]) // joining: replay from 0 brings 0..4, live 2 is then a duplicate
	s.Ingest(ctx, 3, payloads[3]) // already applied through replay
	s.Ingest(ctx, 4, payloads[4])
	_, dels := c.snapshot()
	checkContiguous(t, dels)
	if len(dels) != 5 {
		t.Fatalf("%d deliveries", len(dels))
	}
	for i, d := range dels {
		if !d.Replayed || d.Events[0].Removed[0] != kv.EngineHash(i) {
			t.Fatalf("delivery %d: %+v", i, d)
		}
	}
	if st := s.Stats(); st.Duplicates != 3 || st.Replayed != 5 || st.Gaps != 0 {
		t.Fatalf("stats %+v", st)
	}
}
