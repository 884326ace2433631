package frontend

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/kvmesh/kvmesh/runtime"
)

// controlPlane starts an embedded NATS with a discovery bucket of the given
// TTL for one test, and checks for leaked goroutines after everything the
// test registered with t.Cleanup has run.
func controlPlane(t *testing.T, ttl time.Duration) (context.Context, *nats.Conn, *runtime.Discovery) {
	t.Helper()
	// Registered first, so it runs last.
	t.Cleanup(func() {
		goleak.VerifyNone(t, goleak.IgnoreCurrent(),
			goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*ats).start"))
	})
	srv, err := runtime.StartEmbedded(runtime.EmbeddedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := runtime.Connect(runtime.ConnConfig{URLs: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	disc, err := runtime.OpenDiscovery(ctx, nc, runtime.DiscoveryConfig{TTL: ttl, Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	return ctx, nc, disc
}
