package natsbus

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// On the subjects of the event plane, a worker identity publishes only as
// itself, a frontend only reads, and the admin may do anything; a
// subscriber sees exactly the publishes the permissions allow.
func TestFleetIdentitiesOnEventSubjects(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	e, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir(), FleetKey: key})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown()
	type client struct {
		nc   *nats.Conn
		errs chan error
	}
	connect := func(cred *Credential) client {
		t.Helper()
		errs := make(chan error, 8)
		nc, err := nats.Connect(e.URL(), append(cred.Options(), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))...)
		if err != nil {
			t.Fatalf("%s: %v", cred.User(), err)
		}
		t.Cleanup(nc.Close)
		return client{nc, errs}
	}
	derive := func(id Identity) *Credential {
		c, err := FleetCredential(key, id)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	admin, w7, fe := connect(e.Admin()), connect(derive(WorkerIdentity(7))), connect(derive(FrontendIdentity()))
	seen := make(chan string, 16)
	for _, c := range []client{admin, fe} {
		if _, err := c.nc.Subscribe("kvmesh.events.>", func(m *nats.Msg) { seen <- m.Subject }); err != nil {
			t.Fatal(err)
		}
		c.nc.Flush()
	}
	publish := func(c client, subject string, allowed bool) {
		t.Helper()
		c.nc.Publish(subject, []byte("x"))
		c.nc.Flush()
		if allowed {
			for range 2 { // the admin's and the frontend's subscriptions
				select {
				case got := <-seen:
					if got != subject {
						t.Fatalf("delivered %s, want %s", got, subject)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("%s was not delivered", subject)
				}
			}
			return
		}
		select {
		case err := <-c.errs:
			if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				t.Fatalf("publishing %s: %v", subject, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("publishing %s: no permissions violation", subject)
		}
	}
	publish(w7, "kvmesh.events.m.7", true)
	publish(w7, "kvmesh.events.m.8", false)
	publish(fe, "kvmesh.events.m.7", false)
	publish(admin, "kvmesh.events.m.8", true)
	if _, err := w7.nc.Subscribe("kvmesh.events.>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	w7.nc.Flush()
	select {
	case err := <-w7.errs:
		if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Fatalf("worker subscribing to events: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a worker subscribed to every worker's events")
	}
	if len(seen) != 0 {
		t.Fatalf("%d publishes delivered that the permissions refuse", len(seen))
	}
}

// Derivation is per identity and per key: the same identity under
// another key, or another identity under the same key, is another nkey.
func TestFleetCredentialsDiffer(t *testing.T) {
	a := []byte("0123456789abcdef0123456789abcdef")
	b := []byte("fedcba9876543210fedcba9876543210")
	pub := func(key []byte, id Identity) string {
		c, err := FleetCredential(key, id)
		if err != nil {
			t.Fatal(err)
		}
		return c.public()
	}
	keys := map[string]bool{pub(a, WorkerIdentity(7)): true, pub(b, WorkerIdentity(7)): true, pub(a, WorkerIdentity(8)): true, pub(a, FrontendIdentity()): true}
	if len(keys) != 4 {
		t.Fatalf("%d distinct keys of 4 credentials", len(keys))
	}
	if _, err := FleetCredential(a, Identity{Role: roleAdmin}); err == nil {
		t.Fatal("the admin identity was derived from the fleet key")
	}
	if _, err := FleetCredential(a, WorkerIdentity(0)); err == nil {
		t.Fatal("worker 0 was derived")
	}
}
