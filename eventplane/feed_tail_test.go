package eventplane

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/index/ref"
	"github.com/kvmesh/kvmesh/kv"

	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/natsbus/natstest"
	"github.com/kvmesh/kvmesh/workerclient"
)

// announce hands the feed a single-rank load report naming w's last id.
func announce(feed *Feed, w kv.WorkerKey, id uint64) {
	feed.OnLoadReport(LoadReport{Instance: w.Instance, DPRank: w.DPRank, LastEventID: id})
}

// Events lost at the end of a stream leave no gap until a later event; the
// last id announced in load reports reveals them.
func TestEventFeedTailGap(t *testing.T) {
	e := natstest.Start(t)
	clients := workerclient.NewPool()
	defer clients.Close()
	ix := &lockedIndex{ix: ref.New()}
	feed := runFeed(t, e, ix, clients)
	f := startFakeWorker(t, e, 0xabc, 16)
	w := kv.WorkerKey{Instance: f.log.instance}
	feed.OnDiscovery(discovery.Event{Kind: discovery.InstanceAdded, Instance: f.instance()})
	f.publish(5)
	waitSynced(t, feed, ix, f)

	// Announcements the feed has caught up with change nothing.
	for range 3 {
		announce(feed, w, f.log.LastID(0))
	}
	f.lose(3) // the tail of the stream is lost; nothing follows
	announce(feed, w, f.log.LastID(0))
	time.Sleep(50 * time.Millisecond)
	if s := feed.Stats(); s.Gaps != 0 || s.RangeRepairs != 0 {
		t.Fatalf("one announcement (events may be in flight) already repaired: %+v", s)
	}
	announce(feed, w, f.log.LastID(0)) // a report later the feed is still behind
	waitSynced(t, feed, ix, f)
	if s := feed.Stats(); s.Gaps != 1 || s.TailGaps != 1 || s.RangeRepairs != 1 || s.DumpRepairs != 1 {
		t.Fatalf("after a lost tail: %+v", s)
	}

	// A tail longer than the ring needs a dump; unknown workers and ranks
	// are ignored.
	f.lose(30)
	announce(feed, kv.WorkerKey{Instance: 0xdef}, 99)
	announce(feed, kv.WorkerKey{Instance: w.Instance, DPRank: 5}, 99)
	announce(feed, w, f.log.LastID(0))
	announce(feed, w, f.log.LastID(0))
	waitSynced(t, feed, ix, f)
	if s := feed.Stats(); s.TailGaps != 2 || s.DumpRepairs != 2 {
		t.Fatalf("after a long lost tail: %+v", s)
	}
}

// With several DP ranks one load report carries every rank's last event id,
// so a tail lost on rank 1 is repaired too; a report in the old format
// (last_event_id only) still announces rank 0.
func TestEventFeedTailGapOtherRank(t *testing.T) {
	e := natstest.Start(t)
	clients := workerclient.NewPool()
	defer clients.Close()
	ix := &lockedIndex{ix: ref.New()}
	feed := runFeed(t, e, ix, clients)
	f := startFakeWorker(t, e, 0xabd, 16)
	f.dp = 2
	id := f.log.instance
	feed.OnDiscovery(discovery.Event{Kind: discovery.InstanceAdded, Instance: f.instance()})
	f.publish(5)
	f.useRank(1)
	f.publish(4)
	waitSynced(t, feed, ix, f)
	report := func() LoadReport {
		return LoadReport{Instance: id, LastEventID: f.log.LastID(0), LastEventIDs: []uint64{f.log.LastID(0), f.log.LastID(1)}}
	}

	f.lose(3) // rank 1's tail is lost; nothing follows
	feed.OnLoadReport(report())
	time.Sleep(50 * time.Millisecond)
	if s := feed.Stats(); s.Gaps != 0 {
		t.Fatalf("one announcement already repaired: %+v", s)
	}
	feed.OnLoadReport(report())
	waitSynced(t, feed, ix, f)
	if s := feed.Stats(); s.Gaps != 1 || s.TailGaps != 1 || s.RangeRepairs != 1 {
		t.Fatalf("after a lost tail on rank 1: %+v", s)
	}

	f.useRank(0)
	f.lose(2)
	var old LoadReport
	if err := json.Unmarshal(fmt.Appendf(nil, `{"instance_id":%d,"last_event_id":%d}`, id, f.log.LastID(0)), &old); err != nil {
		t.Fatal(err)
	}
	feed.OnLoadReport(old)
	feed.OnLoadReport(old)
	waitSynced(t, feed, ix, f)
	if s := feed.Stats(); s.TailGaps != 2 || s.RangeRepairs != 2 {
		t.Fatalf("after a lost tail announced the old way: %+v", s)
	}
}
