package streamcopy

import "golang.org/x/sys/cpu"

var streaming = cpu.X86.HasAVX2

// streamBody copies n bytes (a multiple of 128) from src to the 32-byte
// aligned dst with streaming stores, then fences them.
//
//go:noescape
func streamBody(dst, src *byte, n uintptr)
