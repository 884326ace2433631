package eventplane

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/kv"
)

// FuzzParseLoadReport: a load report off the network never panics the
// parser or the feed core it reaches; what parses re-encodes to the same
// report.
func FuzzParseLoadReport(f *testing.F) {
	for _, r := range []LoadReport{
		{Instance: 7, UsedBlocks: 3, TotalBlocks: 10, Running: 1, LastEventID: 9},
		{Instance: 7, DPRank: 1, TotalBlocks: 5, LastEventIDs: []uint64{4, 0, 12}},
	} {
		b, _ := json.Marshal(r)
		f.Add(b)
	}
	f.Add([]byte(`{"instance_id":7,"used_blocks":-1}`))
	f.Add([]byte(`{"instance_id":7,"dp_rank":4294967295,"last_event_ids":[1,2]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseLoadReport(b)
		if err != nil {
			return
		}
		if len(r.LastEventIDs) == 0 {
			r.LastEventIDs = nil // [] and an absent list say the same (omitempty)
		}
		again, _ := json.Marshal(r)
		r2, err := ParseLoadReport(again)
		if err != nil || !reflect.DeepEqual(r, r2) {
			t.Fatalf("re-encoded report %s: %+v %v, want %+v", again, r2, err, r)
		}
		c := NewFeedCore(0)
		c.Discovery(discovery.Event{Kind: discovery.InstanceAdded, Instance: inst(7, 2)})
		c.Load(r)
	})
}

// FuzzFeedMessage: an event batch off NATS, whatever its bytes, never
// panics the feed core; it is applied, queued, or counted as bad.
func FuzzFeedMessage(f *testing.F) {
	good, err := protoMarshalBatch(7, []kv.Event{{ID: 1, Worker: kv.WorkerKey{Instance: 7}, Kind: kv.EventStored,
		Blocks: []kv.StoredBlock{{EngineHash: 11, LocalHash: 22}}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte{})
	f.Add([]byte{0x08, 0x07, 0x12, 0x02, 0x08, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		c := NewFeedCore(4)
		c.Discovery(discovery.Event{Kind: discovery.InstanceAdded, Instance: inst(7, 2)})
		c.Message(EventSubject("m", 7), b)
		c.Message(EventSubject("m", 7), b) // a duplicate
	})
}
