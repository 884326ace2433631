//go:build !linux

package bench

import "time"

// threadCPU is not measured off Linux: the CPU columns read 0.
func threadCPU() time.Duration { return 0 }
