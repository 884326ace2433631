package cputime

import (
	"runtime"
	"testing"
)

func TestThreadCountsWork(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("measured on Linux only")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t0, p0 := Thread(), Process()
	x := uint64(1)
	for i := 0; i < 20_000_000; i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	if d := Thread() - t0; d <= 0 || x == 0 {
		t.Fatalf("a busy loop took %v of thread CPU", d)
	}
	if d := Process() - p0; d <= 0 {
		t.Fatalf("a busy loop took %v of process CPU", d)
	}
}
