package discovery

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvmesh/kvmesh/internal/fleetkey"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/natsbus/natstest"
)

// A keyed watcher believes only records signed with its key and signed
// recently: an unsigned record, one signed with another key, one whose
// bytes were altered after signing and a stale copy are all skipped and
// counted; the genuine one is seen.
func TestWatcherBelievesOnlySignedRecords(t *testing.T) {
	e := natstest.Start(t)
	ctx := natstest.Ctx(t)
	key := fleetkey.Derive("the-fleet-token-0123", fleetkey.Discovery)
	nc := natstest.Connect(t, e.URL())
	d, err := Open(ctx, nc, Config{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := d.Register(ctx, testInstance(1, "m"))
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(ctx)
	kvb, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	bucket, err := kvb.KeyValue(ctx, DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	record := func(id uint64) []byte {
		b, _ := json.Marshal(testInstance(id, "m"))
		return b
	}
	otherKey := fleetkey.Derive("another-fleet-token-9", fleetkey.Discovery)
	altered := signRecord(key, record(5), time.Now())
	altered[len(`{"instance_id":`)] = '6' // now names instance 6
	forged := map[uint64][]byte{
		2: record(2),
		3: signRecord(otherKey, record(3), time.Now()),
		4: signRecord(key, record(4), time.Now().Add(-time.Hour)),
		6: altered,
	}
	for id, val := range forged {
		if _, err := bucket.Put(ctx, instanceKey("m", id), val); err != nil {
			t.Fatal(err)
		}
	}
	var log eventLog
	w, err := d.Watch(ctx, "m", log.add)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	<-w.Synced()
	testutil.WaitFor(t, 5*time.Second, "the forged records counted", func() bool { return w.BadRecords() >= int64(len(forged)) })
	got := w.Instances()
	if len(got) != 1 || got[0].ID != 1 {
		t.Fatalf("watcher believes %v, want only instance 1", got)
	}
	if w.BadRecords() != int64(len(forged)) {
		t.Errorf("bad records %d, want %d", w.BadRecords(), len(forged))
	}
}

// Refreshes re-sign the record; a watcher must not see that as a change.
func TestResigningIsNoUpdate(t *testing.T) {
	a, b := testInstance(1, "m"), testInstance(1, "m")
	a.SignedAt, a.Sig = 10, "aa"
	b.SignedAt, b.Sig = 20, "bb"
	if !sameInstance(a, b) {
		t.Fatal("records differing only in their signatures compare unequal")
	}
	b.GRPCAddr = "127.0.0.1:2"
	if sameInstance(a, b) {
		t.Fatal("records with different addresses compare equal")
	}
}

// On an embedded server with a fleet key, each identity may do exactly its
// part: a worker writes its own discovery key and no other, a frontend
// reads and writes none, and a client without a credential, or with one
// derived from another key, is refused.
func TestFleetIdentitiesOnDiscovery(t *testing.T) {
	natsKey := fleetkey.Derive("the-fleet-token-0123", fleetkey.NATS)
	e, err := natsbus.StartEmbedded(natsbus.EmbeddedConfig{DataDir: t.TempDir(), FleetKey: natsKey})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown()
	ctx := natstest.Ctx(t)
	connect := func(key []byte, id natsbus.Identity) (*natsbus.Credential, error) {
		cred, err := natsbus.FleetCredential(key, id)
		if err != nil {
			t.Fatal(err)
		}
		nc, err := natsbus.Connect(natsbus.ConnConfig{URLs: e.URL(), Credential: cred})
		if err == nil {
			t.Cleanup(nc.Close)
		}
		return cred, err
	}
	if nc, err := natsbus.Connect(natsbus.ConnConfig{URLs: e.URL()}); err == nil {
		nc.Close()
		t.Fatal("a client without a credential connected")
	}
	if _, err := connect(fleetkey.Derive("another-fleet-token-9", fleetkey.NATS), natsbus.WorkerIdentity(7)); err == nil {
		t.Fatal("a credential derived from another token connected")
	}
	open := func(id natsbus.Identity) *Discovery {
		cred, _ := natsbus.FleetCredential(natsKey, id)
		nc, err := natsbus.Connect(natsbus.ConnConfig{URLs: e.URL(), Credential: cred})
		if err != nil {
			t.Fatalf("%s: %v", id.User(), err)
		}
		t.Cleanup(nc.Close)
		d, err := Open(ctx, nc, Config{})
		if err != nil {
			t.Fatalf("%s: %v", id.User(), err)
		}
		return d
	}
	w7, w8, fe := open(natsbus.WorkerIdentity(7)), open(natsbus.WorkerIdentity(8)), open(natsbus.FrontendIdentity())
	r7, err := w7.Register(ctx, testInstance(7, "m"))
	if err != nil {
		t.Fatalf("worker 7 registering itself: %v", err)
	}
	defer r7.Close(ctx)
	var log eventLog
	w, err := fe.Watch(ctx, "m", log.add)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	testutil.WaitFor(t, 5*time.Second, "the frontend to see worker 7", func() bool { return log.count(InstanceAdded, 7) == 1 })

	refused := func(who string, d *Discovery, op func(context.Context, jetstream.KeyValue) error) {
		t.Helper()
		kvb, err := d.bucket(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		// A refused publish goes unanswered: the operation times out.
		octx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		if err := op(octx, kvb); err == nil {
			t.Errorf("%s: allowed", who)
		}
	}
	key7 := instanceKey("m", 7)
	refused("worker 8 deleting worker 7's record", w8, func(c context.Context, kvb jetstream.KeyValue) error { return kvb.Delete(c, key7) })
	refused("worker 8 overwriting worker 7's record", w8, func(c context.Context, kvb jetstream.KeyValue) error {
		_, err := kvb.Put(c, key7, []byte("{}"))
		return err
	})
	refused("worker 8 purging worker 7's record", w8, func(c context.Context, kvb jetstream.KeyValue) error { return kvb.Purge(c, key7) })
	refused("the frontend writing a record", fe, func(c context.Context, kvb jetstream.KeyValue) error {
		_, err := kvb.Put(c, instanceKey("m", 9), []byte("{}"))
		return err
	})
	refused("worker 8 deleting the bucket", w8, func(c context.Context, _ jetstream.KeyValue) error { return w8.js.DeleteKeyValue(c, DefaultBucket) })
	if log.count(InstanceRemoved, 7) != 0 || len(w.Instances()) != 1 {
		t.Fatalf("worker 7's record was disturbed: %v", w.Instances())
	}
}
