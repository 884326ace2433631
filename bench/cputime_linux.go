package bench

import (
	"time"

	"golang.org/x/sys/unix"
)

// threadCPU is the calling thread's CPU time (user + system). Unlike wall
// time it leaves out the turns other processes take on a busy machine, so
// a phase's critical path in thread CPU is its wall time on idle cores.
// The caller locks its goroutine to the thread.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}
