package fleet

import (
	"log/slog"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/workerclient"
)

// recordingFeed stands in for a model's event feed.
type recordingFeed struct{ got []discovery.Event }

func (f *recordingFeed) OnDiscovery(ev discovery.Event) { f.got = append(f.got, ev) }

func newTestTable(t *testing.T) (*instances, *router.Router) {
	t.Helper()
	r, err := router.New(router.Config{Mode: router.ModeRoundRobin})
	if err != nil {
		t.Fatal(err)
	}
	clients := workerclient.NewPool()
	t.Cleanup(clients.Close)
	return newInstances(r, clients, slog.New(slog.DiscardHandler)), r
}

// The table drives the router's worker set (a key per DP rank) and the
// feed from each discovery event, and answers lookups from the same state.
func TestInstanceTableDrivesRouterAndFeed(t *testing.T) {
	tab, r := newTestTable(t)
	feed := &recordingFeed{}
	keys := func() []kv.WorkerKey {
		var out []kv.WorkerKey
		for _, wi := range r.Workers("m", kv.RoleAggregated) {
			out = append(out, wi.Key)
		}
		slices.SortFunc(out, func(a, b kv.WorkerKey) int { return int(a.DPRank) - int(b.DPRank) })
		return out
	}
	in := discovery.Instance{ID: 7, Model: "m", Role: "aggregated", GRPCAddr: "127.0.0.1:1", DPSize: 2, BlockSize: 16,
		ControlEndpoints: []string{"tcp://127.0.0.1:2", "tcp://127.0.0.1:3"}}
	tab.apply(discovery.Event{Kind: discovery.InstanceAdded, Instance: in}, feed)
	if got := keys(); !slices.Equal(got, []kv.WorkerKey{{Instance: 7}, {Instance: 7, DPRank: 1}}) {
		t.Fatalf("router workers after add: %v", got)
	}
	for _, wi := range r.Workers("m", kv.RoleAggregated) {
		if !wi.HintCapable || wi.ControlEndpoint != in.ControlEndpoints[wi.Key.DPRank] {
			t.Fatalf("rank %d: %+v, want its control endpoint", wi.Key.DPRank, wi)
		}
	}
	if got, ok := tab.get(7); !ok || got.GRPCAddr != in.GRPCAddr {
		t.Fatalf("get(7) = %+v, %v", got, ok)
	}

	// A re-registration with one rank drops the other.
	in.DPSize, in.ControlEndpoints = 1, nil
	tab.apply(discovery.Event{Kind: discovery.InstanceUpdated, Instance: in}, feed)
	if got := keys(); !slices.Equal(got, []kv.WorkerKey{{Instance: 7}}) {
		t.Fatalf("router workers after shrinking to one rank: %v", got)
	}

	tab.apply(discovery.Event{Kind: discovery.InstanceRemoved, Instance: in}, feed)
	if got := keys(); len(got) != 0 {
		t.Fatalf("router workers after removal: %v", got)
	}
	if _, ok := tab.get(7); ok {
		t.Fatal("removed instance still in the table")
	}
	if len(feed.got) != 3 || feed.got[0].Kind != discovery.InstanceAdded || feed.got[2].Kind != discovery.InstanceRemoved {
		t.Fatalf("feed saw %v, want the three events in order", feed.got)
	}
}

// MaxContext is the smallest device KV capacity among the model's workers.
func TestInstanceTableMaxContext(t *testing.T) {
	tab, _ := newTestTable(t)
	for _, in := range []discovery.Instance{
		{ID: 1, Model: "m", BlockSize: 16, KVCapacity: map[string]int{"device": 100, "host": 5000}},
		{ID: 2, Model: "m", BlockSize: 16, KVCapacity: map[string]int{"device": 80}},
		{ID: 3, Model: "m", BlockSize: 16},                                                                // no capacity reported: no bound
		{ID: 5, Model: "m", BlockSize: 16, KVCapacity: map[string]int{"device": 1000}, MaxModelLen: 2000}, // its context bounds it, above the others
		{ID: 4, Model: "other", BlockSize: 16, KVCapacity: map[string]int{"device": 1}},
	} {
		tab.apply(discovery.Event{Kind: discovery.InstanceAdded, Instance: in}, nil)
	}
	if got := tab.maxContext("m"); got != 80*16 {
		t.Fatalf("maxContext(m) = %d, want %d", got, 80*16)
	}
	if got := tab.maxContext("none"); got != 0 {
		t.Fatalf("maxContext of an unserved model = %d, want 0", got)
	}
	tab.apply(discovery.Event{Kind: discovery.InstanceRemoved, Instance: discovery.Instance{ID: 2, Model: "m"}}, nil)
	if got := tab.maxContext("m"); got != 100*16 {
		t.Fatalf("maxContext(m) after the smallest left = %d, want %d", got, 100*16)
	}
	// An engine's own context length bounds it below its KV capacity.
	tab.apply(discovery.Event{Kind: discovery.InstanceAdded, Instance: discovery.Instance{ID: 6, Model: "m", BlockSize: 16,
		KVCapacity: map[string]int{"device": 1000}, MaxModelLen: 700}}, nil)
	if got := tab.maxContext("m"); got != 700 {
		t.Fatalf("maxContext(m) with a 700-token engine = %d, want 700", got)
	}
}
