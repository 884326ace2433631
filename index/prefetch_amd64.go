package index

// prefetch asks the CPU to bring addr's cache line in. Unlike a load it
// retires at once, so a miss does not hold up the instructions after it,
// and it never faults.
//
//go:noescape
func prefetch(addr uintptr)

// prefetchLines prefetches n cache lines from addr on.
//
//go:noescape
func prefetchLines(addr uintptr, n int)
