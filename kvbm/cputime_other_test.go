//go:build !linux

package kvbm

import "time"

// threadCPU is not measured off Linux: the CPU ratio reads 0.
func threadCPU() time.Duration { return 0 }
