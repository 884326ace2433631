package api

import (
	"reflect"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
	"google.golang.org/protobuf/proto"
)

func TestEventRoundTrip(t *testing.T) {
	w := kv.WorkerKey{Instance: 0xdeadbeef, DPRank: 3}
	parent := kv.EngineHash(1 << 63)
	stored := kv.Stored(w, kv.TierHost, &parent, []kv.StoredBlock{{EngineHash: 1, LocalHash: 2}, {EngineHash: ^kv.EngineHash(0), LocalHash: 4}})
	stored.ID, stored.Tokens, stored.LoRA, stored.Salt = 9, []kv.Token{1, 2, 3, 4}, "ad", "tenant-7"
	removed := kv.Removed(w, kv.TierDisk, []kv.EngineHash{5, 6})
	removed.ID = 10
	cleared := kv.Cleared(w)
	cleared.ID = 11
	for _, e := range []kv.Event{stored, removed, cleared} {
		b, err := proto.Marshal(&KvEventBatch{Instance: w.Instance, Events: EventsToProto([]kv.Event{e})})
		if err != nil {
			t.Fatal(err)
		}
		var batch KvEventBatch
		if err := proto.Unmarshal(b, &batch); err != nil {
			t.Fatal(err)
		}
		got, err := EventsFromProto(batch.Events)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got[0], e) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got[0], e)
		}
	}
}

func TestEventFromProtoRejects(t *testing.T) {
	for name, p := range map[string]*KvEvent{
		"nil":          nil,
		"no kind":      {Id: 1},
		"bad tier":     {Id: 1, Kind: EventKind_EVENT_KIND_CLEARED, Tier: 7},
		"empty stored": {Id: 1, Kind: EventKind_EVENT_KIND_STORED},
		"unknown kind": {Id: 1, Kind: 99},
	} {
		if _, err := EventFromProto(p); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
