// Package natstest holds the test set-up shared by the packages that talk
// NATS: an embedded server per test, connections closed with the test, the
// goleak check that knows the NATS server's process-wide goroutine, and a
// poller for conditions that become true over the network.
//
// It is imported by tests only and must not import the rooms it helps test
// (discovery, eventplane, workerclient).
package natstest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/kvmesh/kvmesh/natsbus"
)

// Main runs a package's tests and fails them on leaked goroutines; call it
// from TestMain.
func Main(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The NATS server keeps a process-wide ticker goroutine for its
		// internal time cache.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*ats).start"),
	)
}

// Start runs an embedded server for one test.
func Start(t testing.TB) *natsbus.Embedded {
	t.Helper()
	e, err := natsbus.StartEmbedded(natsbus.EmbeddedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Shutdown)
	return e
}

// Connect opens a connection that retries quickly and closes with the test.
func Connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := natsbus.Connect(natsbus.ConnConfig{URLs: url, ReconnectWait: 50 * time.Millisecond, MaxReconnectWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Ctx is a context that ends with the test or after 30s.
func Ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
