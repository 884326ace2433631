package fleet

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/router"
)

// The router's worker set follows discovery records exactly: a record
// re-registered with fewer DP ranks drops the others, a record whose
// block size the model's pool cannot take is skipped, and a deleted record
// removes every rank.
func TestClusterFollowsRecords(t *testing.T) {
	ctx, nc, disc := controlPlane(t, 10*time.Second)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kvb, err := js.KeyValue(ctx, discovery.DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(ctx, Config{NC: nc, Discovery: disc, Models: []string{"m"},
		Router: router.Config{Mode: router.ModeKV}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	put := func(id uint64, dp, bs int) {
		t.Helper()
		rec := fmt.Sprintf(`{"instance_id":%d,"model":"m","role":"aggregated","grpc_addr":"127.0.0.1:9","dp_size":%d,"block_size":%d}`, id, dp, bs)
		if _, err := kvb.Put(ctx, "m."+natsbus.InstanceToken(id), []byte(rec)); err != nil {
			t.Fatal(err)
		}
	}
	keys := func(want ...kv.WorkerKey) func() bool {
		return func() bool {
			got := c.router.Workers("m", kv.RoleAggregated)
			if len(got) != len(want) {
				return false
			}
			for i, w := range got {
				if w.Key != want[i] {
					return false
				}
			}
			return true
		}
	}
	why := func() string { return fmt.Sprint(c.router.Workers("m", kv.RoleAggregated)) }
	put(0x10, 3, 16)
	waitFor(t, 5*time.Second, "three ranks", keys(kv.WorkerKey{Instance: 0x10}, kv.WorkerKey{Instance: 0x10, DPRank: 1}, kv.WorkerKey{Instance: 0x10, DPRank: 2}), why)
	put(0x10, 1, 16)
	waitFor(t, 5*time.Second, "one rank left", keys(kv.WorkerKey{Instance: 0x10}), why)
	put(0x20, 1, 32) // the pool's block size is 16
	put(0x30, 2, 16)
	waitFor(t, 5*time.Second, "instance 0x30 added", keys(kv.WorkerKey{Instance: 0x10}, kv.WorkerKey{Instance: 0x30}, kv.WorkerKey{Instance: 0x30, DPRank: 1}), why)
	if err := kvb.Delete(ctx, "m."+natsbus.InstanceToken(0x30)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "instance 0x30 removed", keys(kv.WorkerKey{Instance: 0x10}), why)
}
