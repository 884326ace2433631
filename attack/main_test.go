package attack

import (
	"os"
	"testing"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

func TestMain(m *testing.M) { os.Exit(testutil.WithBinary(m).Run()) }
