package runtime

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The NATS server keeps a process-wide ticker goroutine for its
		// internal time cache.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*ats).start"),
	)
}

// startNATS runs an embedded server for one test.
func startNATS(t *testing.T) *Embedded {
	t.Helper()
	e, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Shutdown)
	return e
}

func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := Connect(ConnConfig{URLs: url, ReconnectWait: 50 * time.Millisecond, MaxReconnectWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond until it holds or the deadline passes.
var eventually = testutil.WaitFor
