package eventplane

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"

	"github.com/kvmesh/kvmesh/natsbus/natstest"
)

func TestLoadReports(t *testing.T) {
	e := natstest.Start(t)
	nc := natstest.Connect(t, e.URL())
	var mu sync.Mutex
	got := map[uint64]LoadReport{}
	bad := 0
	sub, err := SubscribeLoad(nc, "m", func(r LoadReport) {
		mu.Lock()
		got[r.Instance] = r
		mu.Unlock()
	}, func(error) { mu.Lock(); bad++; mu.Unlock() })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		RunLoadPublisher(ctx, natstest.Connect(t, e.URL()), "m", 20*time.Millisecond, func() []LoadReport {
			return []LoadReport{{Instance: 0x42, UsedBlocks: 3, TotalBlocks: 10, Running: 1}}
		}, nil)
	}()
	nc.Publish(LoadSubject("m", 0x43), []byte("nope"))
	nc.Publish(LoadSubject("m", 0x44), []byte(`{"instance_id":1}`))
	testutil.WaitFor(t, 5*time.Second, "load report", func() bool {
		mu.Lock()
		defer mu.Unlock()
		r, ok := got[0x42]
		return ok && r.UsedBlocks == 3 && r.TotalBlocks == 10 && r.UnixNano != 0 && bad == 2 && len(got) == 1
	})
	cancel()
	<-done
}

// Reports name the last event id per worker key: old reports (no
// last_event_ids) for their dp_rank, new ones for every rank.
func TestLoadReportLastEvents(t *testing.T) {
	collect := func(js string) map[kv.WorkerKey]uint64 {
		t.Helper()
		var r LoadReport
		if err := json.Unmarshal([]byte(js), &r); err != nil {
			t.Fatal(err)
		}
		out := map[kv.WorkerKey]uint64{}
		for w, id := range r.LastEvents() {
			out[w] = id
		}
		return out
	}
	for _, tc := range []struct {
		js   string
		want map[kv.WorkerKey]uint64
	}{
		{`{"instance_id":7,"last_event_id":12}`, map[kv.WorkerKey]uint64{{Instance: 7}: 12}},
		{`{"instance_id":7,"dp_rank":2,"last_event_id":12}`, map[kv.WorkerKey]uint64{{Instance: 7, DPRank: 2}: 12}},
		{`{"instance_id":7}`, map[kv.WorkerKey]uint64{}},
		{`{"instance_id":7,"last_event_id":12,"last_event_ids":[12,0,30]}`, map[kv.WorkerKey]uint64{{Instance: 7}: 12, {Instance: 7, DPRank: 2}: 30}},
	} {
		if got := collect(tc.js); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.js, got, tc.want)
		}
	}
	// A single-rank report keeps the old format.
	b, err := json.Marshal(LoadReport{Instance: 7, LastEventID: 3})
	if err != nil || strings.Contains(string(b), "last_event_ids") {
		t.Fatalf("%s %v", b, err)
	}
}
