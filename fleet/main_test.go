package fleet

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testutil.WithBinary(m),
		// The NATS server keeps a process-wide ticker goroutine for its
		// internal time cache.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*ats).start"))
}
