//go:build !linux

// Package cputime reads the calling thread's CPU time, which benchmarks on
// a shared machine compare where wall time mostly measures the scheduler.
// It imports nothing of kvmesh; benchmarks (bench, kvbm's) use it.
package cputime

import "time"

// Thread is not measured off Linux: it reads 0.
func Thread() time.Duration { return 0 }

// Process is not measured off Linux: it reads 0.
func Process() time.Duration { return 0 }

// ThreadFaults is not measured off Linux: it reads 0, 0.
func ThreadFaults() (sys time.Duration, minor int64) { return 0, 0 }
