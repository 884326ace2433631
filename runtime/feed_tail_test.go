package runtime

import (
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/index/ref"
	"github.com/kvmesh/kvmesh/kv"
)

// Events lost at the end of a stream leave no gap until a later event; the
// last id announced in load reports reveals them.
func TestEventFeedTailGap(t *testing.T) {
	e := startNATS(t)
	clients := NewWorkerClients()
	defer clients.Close()
	ix := &lockedIndex{ix: ref.New()}
	feed := runFeed(t, e, ix, clients)
	f := startFakeWorker(t, e, 0xabc, 16)
	w := kv.WorkerKey{Instance: f.log.instance}
	feed.OnDiscovery(DiscoveryEvent{Kind: InstanceAdded, Instance: f.instance()})
	f.publish(5)
	waitSynced(t, feed, ix, f)

	// Announcements the feed has caught up with change nothing.
	for range 3 {
		feed.OnLoad(w, f.log.LastID(0))
	}
	f.lose(3) // the tail of the stream is lost; nothing follows
	feed.OnLoad(w, f.log.LastID(0))
	time.Sleep(50 * time.Millisecond)
	if s := feed.Stats(); s.Gaps != 0 || s.RangeRepairs != 0 {
		t.Fatalf("one announcement (events may be in flight) already repaired: %+v", s)
	}
	feed.OnLoad(w, f.log.LastID(0)) // a report later the feed is still behind
	waitSynced(t, feed, ix, f)
	if s := feed.Stats(); s.Gaps != 1 || s.TailGaps != 1 || s.RangeRepairs != 1 || s.DumpRepairs != 1 {
		t.Fatalf("after a lost tail: %+v", s)
	}

	// A tail longer than the ring needs a dump; unknown workers and ranks
	// are ignored.
	f.lose(30)
	feed.OnLoad(kv.WorkerKey{Instance: 0xdef}, 99)
	feed.OnLoad(kv.WorkerKey{Instance: w.Instance, DPRank: 5}, 99)
	feed.OnLoad(w, f.log.LastID(0))
	feed.OnLoad(w, f.log.LastID(0))
	waitSynced(t, feed, ix, f)
	if s := feed.Stats(); s.TailGaps != 2 || s.DumpRepairs != 2 {
		t.Fatalf("after a long lost tail: %+v", s)
	}
}
