package twin

import (
	"bytes"
	"encoding/json"
	"runtime"
	"testing"

	"github.com/kvmesh/kvmesh/router"
)

// TestIndexFeedSameResults replays the trace slice with the index fed on
// a second goroutine and on the event loop's own, in the modes that read
// the index (kv, kv+hints, round-robin's regret), on pools small enough to
// evict, with a host tier, with P/D and in a closed loop: every
// measurement but the run's own wall and CPU time must be the same.
func TestIndexFeedSameResults(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(2, runtime.GOMAXPROCS(0))))
	wl := loadSlice(t)
	for _, c := range []Config{
		{Mode: string(router.ModeKV), Workers: 4, Blocks: 512, Seed: 3},
		{Mode: ModeKVHints, Workers: 4, Blocks: 512, Seed: 3},
		{Mode: string(router.ModeRoundRobin), Workers: 4, Blocks: 512, Seed: 3},
		{Mode: string(router.ModeKV), Workers: 4, Blocks: 512, KVBM: &KVBM{HostBlocks: 4096}},
		{Mode: ModeKVHints, PrefillWorkers: 2, DecodeWorkers: 2, Blocks: 1024},
		{Mode: string(router.ModeKV), Workers: 3, Concurrency: 16, Blocks: 512},
	} {
		if !asyncIndexFeed(c) {
			t.Fatal("one core: the feed would not run on its own goroutine")
		}
		async := run(t, wl, c)
		c.serialIndex = true
		serial := run(t, wl, c)
		if c.KVBM == nil {
			checkResult(t, async)
		}
		if async.IndexEvents == 0 && c.Mode != string(router.ModeRoundRobin) || async.EvictedBlocks == 0 {
			t.Fatalf("%s: %d index events, %d evicted blocks: the test does not exercise the feed", c.Mode, async.IndexEvents, async.EvictedBlocks)
		}
		a, s := resultJSON(t, async), resultJSON(t, serial)
		if !bytes.Equal(a, s) {
			t.Fatalf("%+v: fed on its own goroutine:\n%s\non the event loop's:\n%s", c, a, s)
		}
	}
}

// resultJSON is r as reports write it: without the run's own timings.
func resultJSON(t *testing.T, r *Result) []byte {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
