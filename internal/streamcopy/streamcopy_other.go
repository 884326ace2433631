//go:build !amd64

package streamcopy

const streaming = false

func streamBody(dst, src *byte, n uintptr) { panic("streamcopy: no streaming stores on this platform") }
