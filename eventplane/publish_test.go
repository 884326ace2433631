package eventplane

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus/natstest"
)

// A stored event reaches the plane and the log with its blocks, local
// hashes, LoRA and salt, and without its token ids.
func TestPublisherLeavesTokensOut(t *testing.T) {
	e := natstest.Start(t)
	nc := natstest.Connect(t, e.URL())
	sub, err := nc.SubscribeSync(EventSubject("m", 3))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	log := mustLog(t, 3, 16, nil)
	pub := NewPublisher(natstest.Connect(t, e.URL()), "m", log, nil)
	blocks := []kv.StoredBlock{{EngineHash: 11, LocalHash: 21}, {EngineHash: 12, LocalHash: 22}}
	ev := kv.Stored(kv.WorkerKey{DPRank: 0}, kv.TierDevice, nil, blocks)
	ev.Tokens, ev.LoRA, ev.Salt = []kv.Token{1, 2, 3, 4}, "ad", "tenant"
	pub.Sink([]kv.Event{ev})

	var msg *nats.Msg
	if msg, err = sub.NextMsg(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	var b api.KvEventBatch
	if err := proto.Unmarshal(msg.Data, &b); err != nil {
		t.Fatal(err)
	}
	got, err := api.EventsFromProto(b.Events)
	if err != nil || len(got) != 1 {
		t.Fatalf("published %d events, err %v", len(got), err)
	}
	g := got[0]
	if len(g.Tokens) != 0 || len(g.Blocks) != 2 || g.Blocks[1] != blocks[1] || g.LoRA != "ad" || g.Salt != "tenant" || g.ID != 1 {
		t.Fatalf("published %+v", g)
	}
	logged, _ := log.Range(kv.WorkerKey{Instance: 3}, 1, 1, 0)
	if len(logged) != 1 || logged[0].Tokens != nil || len(logged[0].Blocks) != 2 {
		t.Fatalf("logged %+v", logged)
	}
}
