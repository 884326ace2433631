//go:build !amd64

package index

func prefetch(addr uintptr) {}
