package index

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// populate faults in the whole pages inside the n bytes at p in one call
// (MADV_POPULATE_WRITE), where first touches would take a fault per 4 KB
// page: a node chunk is 34 pages, and in a virtual machine each fault is
// a few microseconds. Errors (an old kernel) are ignored: the pages then
// fault in as before.
func populate(p unsafe.Pointer, n uintptr) {
	const page = 4096
	lo := (uintptr(p) + page - 1) &^ (page - 1)
	hi := (uintptr(p) + n) &^ (page - 1)
	if hi <= lo {
		return
	}
	unix.Syscall(unix.SYS_MADVISE, lo, hi-lo, unix.MADV_POPULATE_WRITE)
}
