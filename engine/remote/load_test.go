package remote

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

func TestRankLoad(t *testing.T) {
	var l RankLoad
	if got := l.Rank(0, 100); got != (engine.Stats{TotalBlocks: 100}) {
		t.Fatalf("before a read: %+v", got)
	}
	if got := l.Sum(); got != (engine.Stats{}) {
		t.Fatalf("sum before a read: %+v", got)
	}
	l.Store([]engine.Stats{{Running: 1, Waiting: 2, UsedBlocks: 3, TotalBlocks: 100}, {Running: 4, UsedBlocks: 5, TotalBlocks: 100}})
	if got := l.Rank(1, 100); got != (engine.Stats{Running: 4, UsedBlocks: 5, TotalBlocks: 100}) {
		t.Fatalf("rank 1: %+v", got)
	}
	if got := l.Rank(2, 100); got != (engine.Stats{TotalBlocks: 100}) {
		t.Fatalf("a rank not read: %+v", got)
	}
	if got := l.Sum(); got != (engine.Stats{Running: 5, Waiting: 2, UsedBlocks: 8, TotalBlocks: 200}) {
		t.Fatalf("sum: %+v", got)
	}
}

// Every calls f until its context ends, and the wait group then drains.
func TestEvery(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var calls atomic.Int32
	Every(ctx, &wg, time.Millisecond, func(c context.Context) {
		if c != ctx {
			t.Error("f got another context")
		}
		calls.Add(1)
	})
	testutil.WaitFor(t, 10*time.Second, "three calls", func() bool { return calls.Load() >= 3 })
	cancel()
	wg.Wait()
	n := calls.Load()
	time.Sleep(10 * time.Millisecond)
	if calls.Load() != n {
		t.Fatal("called after its context ended")
	}
}
