package router

import (
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

// The derived state AddWorker and RemoveWorker keep as workers come, change
// and go (a pool's dense slots and decode-only count, the count of workers
// without KV events) always equals what a recount from the workers gives.
func TestDerivedWorkerStateFollowsChanges(t *testing.T) {
	r := newRouter(t, Config{Mode: ModeKV, Matcher: newFakeIndex()})
	rng := rand.New(rand.NewPCG(3, 4))
	for step := range 2000 {
		k := uint64(rng.IntN(24))
		if rng.IntN(4) == 0 {
			r.RemoveWorker(key(k))
		} else {
			info := winfo(k)
			info.Model = []string{"m", "m2"}[rng.IntN(2)]
			info.Role = []kv.Role{"", kv.Role("prefill")}[rng.IntN(2)]
			info.NoKVEvents = rng.IntN(3) == 0
			info.DecodeOnly = rng.IntN(3) == 0
			info.MaxBatchedTokens = rng.IntN(2) * 4096
			if rng.IntN(3) == 0 {
				info.LoRAs = []string{"a"}
			}
			if rng.IntN(3) == 0 {
				info.TierLoad[kv.TierHost] = 0.2
			}
			if rng.IntN(3) == 0 {
				info.Timing = EngineTiming{Prefill: [3]float64{0, 0.01, 5}, DecodeFloor: 1}
			}
			if err := r.AddWorker(info); err != nil {
				t.Fatal(err)
			}
		}
		checkDerived(t, r, step)
	}
}

func checkDerived(t *testing.T, r *Router, step int) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var blind int64
	for _, w := range r.workers {
		if w.info.NoKVEvents {
			blind++
		}
	}
	if got := r.blind.Load(); got != blind {
		t.Fatalf("step %d: blind %d, recount %d", step, got, blind)
	}
	for pk, p := range r.pools {
		if len(p.slots) != len(p.workers) {
			t.Fatalf("step %d: pool %v: %d slots for %d workers", step, pk, len(p.slots), len(p.workers))
		}
		decodeOnly := 0
		for i, w := range p.workers {
			if w.info.DecodeOnly {
				decodeOnly++
			}
			got, want := p.slots[i], slotOf(w)
			if got != want || *got.timing != w.info.Timing.orDefault() || got.load != r.loads[w.info.Key] {
				t.Fatalf("step %d: pool %v slot %d is %+v, want %+v", step, pk, i, got, want)
			}
		}
		if p.decodeOnly != decodeOnly {
			t.Fatalf("step %d: pool %v: decodeOnly %d, recount %d", step, pk, p.decodeOnly, decodeOnly)
		}
	}
}
