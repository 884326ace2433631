package eventplane

import (
	"testing"

	"github.com/kvmesh/kvmesh/index/ref"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/natsbus/natstest"
	"github.com/kvmesh/kvmesh/workerclient"
)

// The collector reports the feed's own counters, per model, and two feeds
// share a registry.
func TestEventFeedCollector(t *testing.T) {
	e := natstest.Start(t)
	clients := workerclient.NewPool()
	defer clients.Close()
	ix := &lockedIndex{ix: ref.New()}
	feed := runFeed(t, e, ix, clients)
	other, err := NewFeed(nil, FeedConfig{Model: "other model", Applier: ix, Repairer: workerclient.Repairer{Clients: clients}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(feed.Collector(), other.Collector())
	if err := reg.Register(feed.Collector()); err == nil {
		t.Fatal("the same feed registered twice")
	}

	f := startFakeWorker(t, e, 0xabc, 16)
	feed.OnDiscovery(discovery.Event{Kind: discovery.InstanceAdded, Instance: f.instance()})
	waitSynced(t, feed, ix, f)
	f.publish(4)
	waitSynced(t, feed, ix, f)
	f.lose(2)
	f.publish(2)
	waitSynced(t, feed, ix, f)
	f.lose(40)
	f.publish(1)
	waitSynced(t, feed, ix, f)

	s := feed.Stats()
	if s.Gaps != 2 || s.RangeRepairs != 1 || s.DumpRepairs != 2 {
		t.Fatalf("stats %+v", s)
	}
	got := gather(t, reg)
	for k, v := range map[string]float64{
		`kvmesh_event_feed_gaps_total{kind="sequence",model="m"}`:            2,
		`kvmesh_event_feed_gaps_total{kind="tail",model="m"}`:                0,
		`kvmesh_event_feed_repairs_total{kind="range",model="m"}`:            1,
		`kvmesh_event_feed_repairs_total{kind="dump",model="m"}`:             2,
		`kvmesh_event_feed_events_applied_total{model="m"}`:                  float64(s.Applied),
		`kvmesh_event_feed_batches_total{model="m"}`:                         float64(s.Batches),
		`kvmesh_event_feed_instance_changes_total{change="added",model="m"}`: 1,
		`kvmesh_event_feed_gaps_total{kind="tail",model="other model"}`:      0,
	} {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	if s.Applied == 0 || len(got) != 2*16 {
		t.Fatalf("%d series, want 16 per feed; applied %d", len(got), s.Applied)
	}
}

// gather scrapes reg into name{label="v",...} → value.
var gather = testutil.Metrics
