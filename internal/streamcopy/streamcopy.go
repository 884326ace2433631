// Package streamcopy owns kvmesh's copy into memory that will not be read
// soon: a KV block going into the host tier's arena (gigabytes, cold) or
// back onto a device. A plain copy of a block that size reads each
// destination line into cache before overwriting it; streaming
// (non-temporal) stores skip that read, so the copy moves a third less
// memory traffic, the same trade Go's own copy makes for copies of a
// megabyte and more. The destination is then not in cache: a caller that
// checksums the bytes reads the source, which the copy just pulled in.
// It imports nothing of kvmesh's.
package streamcopy

import "unsafe"

// minStream is the shortest copy worth streaming: below it the block may
// well be read again while still cached, and the fence costs more than
// the saved reads.
const minStream = 4 << 10

// Copy copies min(len(dst), len(src)) bytes from src to dst, which must
// not overlap (overlapping slices are copied with copy), and returns the
// count.
func Copy(dst, src []byte) int {
	n := min(len(dst), len(src))
	if !streaming || n < minStream || overlap(dst[:n], src[:n]) {
		return copy(dst, src)
	}
	// Streaming stores want 32-byte aligned destinations and whole
	// 128-byte strides: copy the unaligned head and the short tail plainly.
	head := int(-uintptr(unsafe.Pointer(&dst[0])) & 31)
	body := (n - head) &^ 127
	copy(dst[:head], src[:head])
	streamBody(&dst[head], &src[head], uintptr(body))
	copy(dst[head+body:n], src[head+body:n])
	return n
}

func overlap(a, b []byte) bool {
	pa, pb := uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0]))
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}
