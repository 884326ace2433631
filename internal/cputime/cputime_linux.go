// Package cputime reads the calling thread's CPU time, which benchmarks on
// a shared machine compare where wall time mostly measures the scheduler.
// It imports nothing of kvmesh; benchmarks (bench, kvbm's) use it.
package cputime

import (
	"time"

	"golang.org/x/sys/unix"
)

// Thread is the calling thread's CPU time (user + system). Unlike wall
// time it leaves out the turns other processes take; the caller locks its
// goroutine to the thread for as long as it measures.
func Thread() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// Process is the CPU time (user + system) of every thread of the process
// so far.
func Process() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// ThreadFaults is the calling thread's system CPU time and its minor page
// faults so far (getrusage RUSAGE_THREAD): where a benchmark's thread CPU
// goes to the kernel faulting fresh memory in.
func ThreadFaults() (sys time.Duration, minor int64) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		return 0, 0
	}
	return time.Duration(ru.Stime.Nano()), ru.Minflt
}
