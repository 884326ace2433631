package discovery

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/natsbus/natstest"
)

func TestMain(m *testing.M) { natstest.Main(m) }

type eventLog struct {
	mu  sync.Mutex
	evs []Event
}

func (l *eventLog) add(ev Event) {
	l.mu.Lock()
	l.evs = append(l.evs, ev)
	l.mu.Unlock()
}

func (l *eventLog) count(kind EventKind, id uint64) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, ev := range l.evs {
		if ev.Kind == kind && ev.Instance.ID == id {
			n++
		}
	}
	return n
}

func testInstance(id uint64, model string) Instance {
	return Instance{ID: id, Model: model, Role: "aggregated", GRPCAddr: "127.0.0.1:1", DPSize: 1, BlockSize: 16,
		KVCapacity: map[string]int{"device": 1000}}
}

func TestDiscoveryAddExpireDeregister(t *testing.T) {
	e := natstest.Start(t)
	ctx := natstest.Ctx(t)
	ncW, ncR := natstest.Connect(t, e.URL()), natstest.Connect(t, e.URL())
	dw, err := Open(ctx, ncW, Config{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	dr, err := Open(ctx, ncR, Config{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if dr.TTL() != time.Second {
		t.Fatalf("second opener TTL %v, want the bucket's 1s", dr.TTL())
	}
	var log eventLog
	w, err := dr.Watch(ctx, "m/a:b", log.add)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	<-w.Synced()

	r1, err := dw.Register(ctx, testInstance(1, "m/a:b"))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := dw.Register(ctx, testInstance(2, "m/a:b"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := dw.Register(ctx, testInstance(3, "other"))
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "two adds", func() bool { return log.count(InstanceAdded, 1) == 1 && log.count(InstanceAdded, 2) == 1 })
	if got := len(w.Instances()); got != 2 {
		t.Fatalf("instances %d, want 2 (other model filtered)", got)
	}

	// Records outlive several TTLs while refreshed.
	time.Sleep(2500 * time.Millisecond)
	if log.count(InstanceRemoved, 1) != 0 || len(w.Instances()) != 2 {
		t.Fatalf("refreshed instance removed: %+v", log.evs)
	}

	// Deregister: removal at once.
	if err := r2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "deregister removal", func() bool { return log.count(InstanceRemoved, 2) == 1 })

	// Stop refreshing without deleting (a crash): the TTL expiry must reach
	// the watcher as a removal.
	r1.cancel()
	<-r1.done
	start := time.Now()
	testutil.WaitFor(t, 5*time.Second, "TTL expiry removal", func() bool { return log.count(InstanceRemoved, 1) == 1 })
	t.Logf("expiry seen %v after the last refresh stopped (TTL 1s)", time.Since(start).Round(10*time.Millisecond))
	if len(w.Instances()) != 0 {
		t.Fatalf("instances left: %+v", w.Instances())
	}
	_ = other.Close(ctx)
}

func TestDiscoveryBadRecords(t *testing.T) {
	e := natstest.Start(t)
	ctx := natstest.Ctx(t)
	nc := natstest.Connect(t, e.URL())
	d, err := Open(ctx, nc, Config{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var log eventLog
	w, err := d.Watch(ctx, "m", log.add)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	<-w.Synced()
	kvb, _ := d.bucket(ctx, false)
	bad := map[string]string{
		"m.1":   "{not json",
		"m.2":   `{"instance_id":2,"model":"m","role":"aggregated","grpc_addr":"0.0.0.0:5","dp_size":1,"block_size":16}`,
		"m.3":   `{"instance_id":4,"model":"m","role":"aggregated","grpc_addr":"127.0.0.1:5","dp_size":1,"block_size":16}`,
		"m.zz!": `{}`,
		"m.5":   `{"instance_id":5,"model":"m","role":"aggregated","grpc_addr":"127.0.0.1:5","dp_size":2,"block_size":16,"control_endpoints":["tcp://127.0.0.1:9"]}`,
		// Passes a lax endpoint check, but no peer can dial it (kv.ParseEndpoint).
		"m.9": `{"instance_id":9,"model":"m","role":"aggregated","grpc_addr":"127.0.0.1:5","dp_size":1,"block_size":16,"control_endpoints":["tcp://my_host:9000"]}`,
	}
	for k, v := range bad {
		if _, err := kvb.PutString(ctx, k, v); err != nil {
			// "m.zz!" is an invalid key for the client; skip it.
			continue
		}
	}
	if _, err := d.Register(ctx, Instance{ID: 7, Model: "m", Role: "x", GRPCAddr: "127.0.0.1:1", DPSize: 1, BlockSize: 1}); err == nil {
		t.Fatal("register accepted a bad role")
	}
	good, err := d.Register(ctx, testInstance(6, "m"))
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "good instance", func() bool { return log.count(InstanceAdded, 6) == 1 })
	testutil.WaitFor(t, 5*time.Second, "bad records counted", func() bool { return w.BadRecords() >= 5 })
	if n := len(w.Instances()); n != 1 {
		t.Fatalf("instances %+v, want only 6", w.Instances())
	}
	if err := good.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}
