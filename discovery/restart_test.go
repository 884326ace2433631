package discovery

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvmesh/kvmesh/internal/fleetkey"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/natsbus/natstest"
)

// A NATS restart (same port, same data dir) must not end anything: the
// registration refreshes again, watchers resync, and an instance that died
// during the outage is removed.
func TestDiscoverySurvivesNATSRestart(t *testing.T) { survivesRestart(t, false) }

// The same on an authenticated server (serve's default): the writer as the
// server's admin (two instances), the reader as a frontend, records signed;
// both prove themselves again to the restarted server.
func TestDiscoverySurvivesAuthenticatedNATSRestart(t *testing.T) { survivesRestart(t, true) }

func survivesRestart(t *testing.T, auth bool) {
	dir := t.TempDir()
	cfg := natsbus.EmbeddedConfig{DataDir: dir}
	var reader *natsbus.Credential
	var recordKey []byte
	if auth {
		cfg.FleetKey = fleetkey.Derive("the-fleet-token-0123", fleetkey.NATS)
		recordKey = fleetkey.Derive("the-fleet-token-0123", fleetkey.Discovery)
		var err error
		if cfg.Admin, err = natsbus.NewAdminCredential(); err != nil {
			t.Fatal(err)
		}
		if reader, err = natsbus.FleetCredential(cfg.FleetKey, natsbus.FrontendIdentity()); err != nil {
			t.Fatal(err)
		}
	}
	e, err := natsbus.StartEmbedded(cfg)
	if err != nil {
		t.Fatal(err)
	}
	port := e.Port()
	ctx := natstest.Ctx(t)
	connect := func(cred *natsbus.Credential) *nats.Conn {
		nc, err := natsbus.Connect(natsbus.ConnConfig{URLs: e.URL(), Credential: cred, ReconnectWait: 50 * time.Millisecond, MaxReconnectWait: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	ncW, ncR := connect(e.Admin()), connect(reader)
	dw, err := Open(ctx, ncW, Config{TTL: time.Second, Key: recordKey})
	if err != nil {
		t.Fatal(err)
	}
	dr, err := Open(ctx, ncR, Config{TTL: time.Second, Key: recordKey})
	if err != nil {
		t.Fatal(err)
	}
	var log eventLog
	w, err := dr.Watch(ctx, "m", log.add)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	alive, err := dw.Register(ctx, testInstance(1, "m"))
	if err != nil {
		t.Fatal(err)
	}
	dies, err := dw.Register(ctx, testInstance(2, "m"))
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "both added", func() bool { return len(w.Instances()) == 2 })

	e.Shutdown()
	dies.cancel() // instance 2 dies while NATS is away
	<-dies.done
	time.Sleep(1500 * time.Millisecond)
	cfg.Port = port
	e2, err := natsbus.StartEmbedded(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Shutdown()

	testutil.WaitFor(t, 10*time.Second, "instance 2 removed after restart", func() bool { return log.count(InstanceRemoved, 2) == 1 })
	testutil.WaitFor(t, 10*time.Second, "instance 1 present after restart", func() bool {
		ins := w.Instances()
		return len(ins) == 1 && ins[0].ID == 1
	})
	// It stays: refreshes continue on the new server.
	time.Sleep(1500 * time.Millisecond)
	if ins := w.Instances(); len(ins) != 1 || ins[0].ID != 1 {
		t.Fatalf("after restart: %+v", ins)
	}
	if err := alive.Close(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "instance 1 removed", func() bool { return log.count(InstanceRemoved, 1) >= 1 })
}
