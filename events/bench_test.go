package events

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// benchStore is a typical engine step: one store of 4 blocks of 16 tokens.
func benchStore(i int) []kv.Event {
	const bs = 16
	toks := make([]kv.Token, 4*bs)
	for j := range toks {
		toks[j] = kv.Token(i*131 + j)
	}
	h := kv.NewHasher(bs, "", "")
	local := h.Local(toks)
	blocks := make([]kv.StoredBlock, len(local))
	for j, l := range local {
		blocks[j] = kv.StoredBlock{EngineHash: kv.EngineHash(uint64(i)<<8 | uint64(j)), LocalHash: l}
	}
	e := kv.Stored(kv.WorkerKey{Instance: 1}, kv.TierDevice, nil, blocks)
	e.Tokens = toks
	return []kv.Event{e}
}

// BenchmarkSubscriberIngest: decode + rehash + convert + deliver per batch,
// no network.
func BenchmarkSubscriberIngest(b *testing.B) {
	payload, _ := EncodeBatch(&ToWire(benchStore(1), 16, 1)[0], ShapeMapEvents)
	s, _ := NewSubscriber(Config{Endpoint: "tcp://127.0.0.1:1", BlockSize: 16, Handler: func(Delivery) {}, Logger: quietLogger()})
	ctx := context.Background()
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	seq := uint64(0)
	for b.Loop() {
		s.Ingest(ctx, seq, payload)
		seq++
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "batches/s")
}

// BenchmarkPublish: convert + encode + ring + queue on PUB, no subscriber.
func BenchmarkPublish(b *testing.B) {
	p, err := NewPublisher(context.Background(), PublisherConfig{Endpoint: "tcp://127.0.0.1:0", BlockSize: 16, Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	evs := benchStore(1)
	b.ReportAllocs()
	for b.Loop() {
		if err := p.Publish(evs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "batches/s")
}

// BenchmarkZMQEndToEnd: publisher → loopback ZMQ → subscriber, with replay
// repairing whatever the PUB queue dropped.
func BenchmarkZMQEndToEnd(b *testing.B) {
	p, err := NewPublisher(context.Background(), PublisherConfig{Endpoint: "tcp://127.0.0.1:0",
		ReplayEndpoint: "tcp://127.0.0.1:0", BlockSize: 16, Logger: quietLogger(), BufferSteps: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	var got atomic.Uint64
	s, _ := NewSubscriber(Config{Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(), BlockSize: 16,
		Logger: quietLogger(), Handler: func(d Delivery) { got.Store(d.Seq + 1) }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	// Wait until the subscriber is live.
	for got.Load() == 0 {
		_ = p.Publish(benchStore(0))
		time.Sleep(10 * time.Millisecond)
	}
	evs := benchStore(1)
	start := p.Stats().Batches
	b.ResetTimer()
	for range b.N {
		if err := p.Publish(evs); err != nil {
			b.Fatal(err)
		}
	}
	want := start + uint64(b.N)
	last, idle := got.Load(), 0
	for got.Load() < want {
		time.Sleep(time.Millisecond)
		if g := got.Load(); g != last {
			last, idle = g, 0
		} else if idle++; idle > 50 {
			// The PUB queue dropped the tail above its HWM: a fresh batch
			// shows the subscriber the gap, and replay fills it.
			if _, err := p.PublishBatch(&Batch{Events: []Event{}}); err != nil {
				b.Fatal(err)
			}
			want++
			idle = 0
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "batches/s")
}
