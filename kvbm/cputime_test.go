package kvbm

import (
	"time"

	"github.com/kvmesh/kvmesh/internal/cputime"
)

// threadCPU is the calling thread's CPU time: unlike wall time it does not
// count the time the thread waits for a core, which on a shared machine is
// most of a benchmark's wall time.
func threadCPU() time.Duration { return cputime.Thread() }
