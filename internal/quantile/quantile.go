// Package quantile owns kvmesh's quantiles of sorted samples: nearest rank
// (the twin's and the benchmarks' percentiles) and linear interpolation
// (numpy's default, which aiperf reports and `bench load` matches). Callers
// sort; nothing here allocates. It imports only the standard library.
package quantile

import (
	"cmp"
	"math"
)

// Nearest is the nearest-rank p-quantile of sorted (p in [0, 1]): the
// smallest sample with at least a fraction p of the samples at or below
// it. The zero value for no samples.
func Nearest[T cmp.Ordered](sorted []T, p float64) T {
	if len(sorted) == 0 {
		var zero T
		return zero
	}
	r := p * float64(len(sorted))
	i := int(r) // rank ⌈r⌉, as index ⌈r⌉-1
	if float64(i) == r {
		i--
	}
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// Linear is the p-quantile of sorted interpolated linearly between the
// two nearest ranks (numpy's default method); 0 for no samples.
func Linear(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	pos := p * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	if lo >= len(sorted)-1 {
		return sorted[len(sorted)-1]
	}
	if lo < 0 {
		return sorted[0]
	}
	frac := pos - float64(lo)
	return sorted[lo] + frac*(sorted[lo+1]-sorted[lo])
}
