package events

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"go.uber.org/goleak"

	"github.com/kvmesh/kvmesh/kv"
)

// zmq4's PUB writer goroutine has no exit path (the library never closes
// it), so every publisher leaves exactly that one behind.
var leakOpts = []goleak.Option{goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run")}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// collector gathers deliveries from a subscriber's handler.
type collector struct {
	mu     sync.Mutex
	events []kv.Event
	dels   []Delivery
}

func (c *collector) handle(d Delivery) {
	c.mu.Lock()
	c.events = append(c.events, d.Events...)
	c.dels = append(c.dels, d)
	c.mu.Unlock()
}

func (c *collector) snapshot() ([]kv.Event, []Delivery) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]kv.Event(nil), c.events...), append([]Delivery(nil), c.dels...)
}

// runSub starts a subscriber; the returned stop waits for Run to return.
func runSub(t *testing.T, cfg Config) (*Subscriber, *collector, func()) {
	t.Helper()
	c := &collector{}
	cfg.Handler = c.handle
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	s, err := NewSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	return s, c, func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}

// tickUntil publishes empty batches until cond holds: any live batch that
// reaches the subscriber makes it catch up through replay, which beats
// ZMQ's slow-joiner drop of the first messages.
func tickUntil(t *testing.T, p *Publisher, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for the subscriber")
		}
		if _, err := p.PublishBatch(&Batch{TS: 0, Events: []Event{}}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// simEvents is a sim-like event stream: two DP ranks, LoRA, every tier,
// parents, removes and a clear.
func simEvents(bs int) []kv.Event {
	w0 := kv.WorkerKey{Instance: 42, DPRank: 0}
	w1 := kv.WorkerKey{Instance: 42, DPRank: 1}
	var out []kv.Event
	ids := map[kv.WorkerKey]uint64{}
	add := func(e kv.Event) {
		ids[e.Worker]++
		e.ID = ids[e.Worker]
		out = append(out, e)
	}
	store := func(w kv.WorkerKey, tier kv.Tier, lora string, parent *kv.EngineHash, toks []kv.Token, base uint64) {
		h := kv.NewHasher(bs, lora, "")
		local := h.Local(toks)
		blocks := make([]kv.StoredBlock, len(local))
		for i, l := range local {
			blocks[i] = kv.StoredBlock{EngineHash: kv.EngineHash(base + uint64(i)*0x1e3779b97f4a7c15), LocalHash: l}
		}
		e := kv.Stored(w, tier, parent, blocks)
		e.Tokens, e.LoRA = toks, lora
		add(e)
	}
	toks := func(n, off int) []kv.Token {
		t := make([]kv.Token, n)
		for i := range t {
			t[i] = kv.Token(off + i*7)
		}
		return t
	}
	store(w0, kv.TierDevice, "", nil, toks(3*bs, 1), 1000)
	p := kv.EngineHash(1000)
	store(w0, kv.TierDevice, "", &p, toks(2*bs, 500), 1<<63)
	store(w1, kv.TierHost, "sql-lora", nil, toks(bs, 9), 77)
	store(w0, kv.TierDisk, "", nil, toks(bs, 3), ^uint64(0)-5)
	add(kv.Removed(w0, kv.TierDevice, []kv.EngineHash{1000, 1<<63 + 0x1e3779b97f4a7c15}))
	add(kv.Removed(w1, kv.TierExternal, []kv.EngineHash{77}))
	add(kv.Cleared(w1))
	store(w1, kv.TierDevice, "", nil, toks(4*bs, 11), 5)
	return out
}

func TestRoundTripZMQ(t *testing.T) {
	defer goleak.VerifyNone(t, leakOpts...)
	for _, shape := range []Shape{ShapeArray, ShapeMapEvents, ShapeMap} {
		t.Run(shape.String(), func(t *testing.T) {
			const bs = 4
			p, err := NewPublisher(context.Background(), PublisherConfig{
				Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0",
				Shape: shape, BlockSize: bs, Logger: quietLogger(), Topic: "kv@pod",
			})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			sub, c, stop := runSub(t, Config{Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(),
				Topic: "kv@", Instance: 42, BlockSize: bs})
			in := simEvents(bs)
			// One engine callback with both ranks: two wire batches.
			if err := p.Publish(in[:3]); err != nil {
				t.Fatal(err)
			}
			for i := 3; i < len(in); i++ {
				p.Sink(in[i : i+1])
			}
			tickUntil(t, p, func() bool { evs, _ := c.snapshot(); return len(evs) >= len(in) })
			stop()
			got, _ := c.snapshot()
			requireEvents(t, got, in)
			st := sub.Stats()
			if st.Malformed+st.BadFrames+st.Lost+st.ReplayErrors+st.DroppedEvents != 0 {
				t.Fatalf("unexpected trouble: %+v", st)
			}
		})
	}
}

func TestReplayServesRing(t *testing.T) {
	defer goleak.VerifyNone(t, leakOpts...)
	p, err := NewPublisher(context.Background(), PublisherConfig{
		Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", BufferSteps: 5, Logger: quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := range 8 {
		if seq, err := p.PublishBatch(&Batch{TS: float64(i), Events: []Event{{Type: TypeCleared}}}); err != nil || seq != uint64(i) {
			t.Fatalf("seq %d err %v", seq, err)
		}
	}
	for _, tc := range []struct {
		start uint64
		want  []uint64
	}{{0, []uint64{3, 4, 5, 6, 7}}, {6, []uint64{6, 7}}, {8, nil}} {
		var got []uint64
		err := FetchReplay(context.Background(), p.ReplayEndpoint(), tc.start, 2*time.Second, func(seq uint64, payload []byte) error {
			b, _, err := DecodeBatch(payload)
			if err != nil {
				return err
			}
			if b.TS != float64(seq) {
				t.Errorf("seq %d carries batch %v", seq, b.TS)
			}
			got = append(got, seq)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Fatalf("replay from %d: got %v want %v", tc.start, got, tc.want)
		}
	}
	if st := p.Stats(); st.ReplayRequests != 3 || st.ReplayBatches != 7 || st.Batches != 8 {
		t.Fatalf("stats %+v", st)
	}
}

// vLLM 0.32's replay socket answers [id, "", topic, seq, payload] and ends
// with [id, "", "", END, ""]: the topic frame of its PUB messages comes
// along.
func TestReplayReadsTopicFrames(t *testing.T) {
	defer goleak.VerifyNone(t, leakOpts...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	router := zmq4.NewRouter(ctx)
	defer router.Close()
	if err := router.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() {
		req, err := router.Recv()
		if err != nil {
			served <- err
			return
		}
		id := req.Frames[0]
		for seq := uint64(4); seq < 6; seq++ {
			payload, _ := EncodeBatch(&Batch{TS: float64(seq), Events: []Event{{Type: TypeCleared}}}, ShapeMapEvents)
			if err := router.SendMulti(zmq4.NewMsgFrom(id, nil, []byte("kv"), seqBytes(seq), payload)); err != nil {
				served <- err
				return
			}
		}
		// The client may close as soon as it has read the end marker, before
		// the marker's last (empty) frame is written: a send error here is
		// not the test's concern, and a marker that never arrived fails
		// FetchReplay below.
		_ = router.SendMulti(zmq4.NewMsgFrom(id, nil, nil, endMarker, nil))
		served <- nil
	}()
	var got []uint64
	err := FetchReplay(ctx, "tcp://"+router.Addr().String(), 4, 5*time.Second, func(seq uint64, payload []byte) error {
		b, _, err := DecodeBatch(payload)
		if err != nil || b.TS != float64(seq) {
			return fmt.Errorf("seq %d: batch %+v, %v", seq, b, err)
		}
		got = append(got, seq)
		return nil
	})
	if err != nil || !reflect.DeepEqual(got, []uint64{4, 5}) {
		t.Fatalf("replay: %v, seqs %v, want [4 5]", err, got)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}

// requireEvents fails unless got equals want, naming each event that differs.
func requireEvents(t *testing.T, got, want []kv.Event) {
	t.Helper()
	if reflect.DeepEqual(got, want) {
		return
	}
	for i := range min(len(got), len(want)) {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("event %d:\n got %+v\nwant %+v", i, got[i], want[i])
		}
	}
	t.Fatalf("got %d events, want %d", len(got), len(want))
}

// TestPublisherCloseAfterSubscriberLeft: a subscriber that hung up first
// leaves a connection zmq4 already closed; closing the publisher then is
// still a clean close, many times over.
func TestPublisherCloseAfterSubscriberLeft(t *testing.T) {
	for i := range 20 {
		p, err := NewPublisher(context.Background(), PublisherConfig{
			Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0",
			Logger: quietLogger(), Topic: "kv@pod",
		})
		if err != nil {
			t.Fatal(err)
		}
		sub, _, stop := runSub(t, Config{Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(), Topic: "kv@"})
		tickUntil(t, p, func() bool { return sub.Stats().Batches > 0 })
		stop()
		time.Sleep(time.Duration(i%4) * time.Millisecond)
		if err := p.Close(); err != nil {
			t.Fatalf("round %d: close after the subscriber left: %v", i, err)
		}
	}
}
