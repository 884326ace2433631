//go:build !amd64

package index

func prefetch(addr uintptr) {}

func prefetchLines(addr uintptr, n int) {}
