package eventplane

import (
	"context"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/kv"

	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/natsbus"
)

// benchBatch is a steady-state cache: a 16-block Stored chain, and from
// the 1024th on the removal of the chain stored 1024 batches earlier.
func benchBatch(w kv.WorkerKey, i uint64) []kv.Event {
	h := func(i uint64, j int) uint64 { return (i<<8 | uint64(j) + 1) * 0x9E3779B97F4A7C15 }
	blocks := make([]kv.StoredBlock, 16)
	for j := range blocks {
		blocks[j] = kv.StoredBlock{EngineHash: kv.EngineHash(h(i, j)), LocalHash: kv.LocalHash(h(i, j) ^ 0x5555)}
	}
	evs := []kv.Event{kv.Stored(w, kv.TierDevice, nil, blocks)}
	if i >= 1024 {
		old := make([]kv.EngineHash, 16)
		for j := range old {
			old[j] = kv.EngineHash(h(i-1024, 15-j))
		}
		evs = append(evs, kv.Removed(w, kv.TierDevice, old))
	}
	return evs
}

// Worker side: stamp, ring, protobuf, NATS publish, per
// 16-block Stored event.
func BenchmarkPublisherSink(b *testing.B) {
	e, err := natsbus.StartEmbedded(natsbus.EmbeddedConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Shutdown()
	nc, err := natsbus.Connect(natsbus.ConnConfig{URLs: e.URL()})
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	l, _ := NewEventLog(1, 0, nil)
	p := NewPublisher(nc, "m", l, nil)
	w := kv.WorkerKey{Instance: 1}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		p.Sink(benchBatch(w, uint64(i)))
	}
	b.ReportMetric(float64(l.LastID(0))/b.Elapsed().Seconds(), "events/s")
}

// End to end: publisher → NATS → Feed → index, 16-block events.
func BenchmarkEventPlaneThroughput(b *testing.B) {
	e, err := natsbus.StartEmbedded(natsbus.EmbeddedConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Shutdown()
	ncP, _ := natsbus.Connect(natsbus.ConnConfig{URLs: e.URL()})
	ncF, _ := natsbus.Connect(natsbus.ConnConfig{URLs: e.URL()})
	defer ncP.Close()
	defer ncF.Close()
	l, _ := NewEventLog(1, 1<<16, nil)
	p := NewPublisher(ncP, "m", l, nil)
	feed, _ := NewFeed(ncF, FeedConfig{Model: "m", Applier: index.New(), Repairer: logRepairer{l}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- feed.Run(ctx) }()
	defer func() { cancel(); <-done }()
	w := kv.WorkerKey{Instance: 1}
	feed.OnDiscovery(discovery.Event{Kind: discovery.InstanceAdded, Instance: discovery.Instance{ID: 1, Model: "m", Role: "aggregated", GRPCAddr: "127.0.0.1:1", DPSize: 1, BlockSize: 16}})
	for {
		if _, ok := feed.LastID(w); ok {
			break
		}
		time.Sleep(time.Millisecond)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p.Sink(benchBatch(w, uint64(i)))
	}
	for {
		if last, _ := feed.LastID(w); last == l.LastID(0) {
			break
		}
		time.Sleep(100 * time.Microsecond)
	}
	b.ReportMetric(float64(l.LastID(0))/b.Elapsed().Seconds(), "events/s")
	s := feed.Stats()
	b.ReportMetric(float64(s.Gaps), "gaps")
}

// logRepairer answers repairs straight from an EventLog (no gRPC).
type logRepairer struct{ l *EventLog }

func (r logRepairer) Events(_ context.Context, _ discovery.Instance, w kv.WorkerKey, from, to uint64) ([]kv.Event, bool, error) {
	evs, res := r.l.Range(w, from, to, 0)
	return evs, res.TooOld, nil
}

func (r logRepairer) Dump(_ context.Context, _ discovery.Instance, w kv.WorkerKey) ([]kv.Event, uint64, error) {
	evs, last, _ := r.l.Dump(w)
	return evs, last, nil
}
