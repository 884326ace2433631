package router

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
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

// A filter that says it is idle for a request keeps every worker: the
// candidates and the error filter leaves equal those of asking every
// filter about every worker, over random pools (decode-only workers,
// adapters, booked load), thresholds and requests.
func TestIdleFiltersKeepEveryWorker(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for round := range 40 {
		cfg := Config{Mode: ModeKV, Matcher: newFakeIndex()}
		if rng.IntN(2) == 0 {
			cfg.MaxPrefillTokens = int64(rng.IntN(3000))
		}
		if rng.IntN(3) == 0 {
			cfg.MaxKVUsage = 0.01 + rng.Float64()/4
		}
		if rng.IntN(2) == 0 {
			cfg.Admit = &AdmitConfig{PrefillPasses: 1, KVUsage: 0.5, Waiting: -1}
		}
		r := newRouter(t, cfg)
		for k := range uint64(2 + rng.IntN(12)) {
			info := winfo(k)
			info.DecodeOnly = rng.IntN(4) == 0
			if rng.IntN(3) == 0 {
				info.LoRAs = []string{"a"}
			}
			if err := r.AddWorker(info); err != nil {
				t.Fatal(err)
			}
		}
		for range rng.IntN(6) { // book some load, left open; busy is fine
			_, _ = r.Route(context.Background(), Request{Model: "m", Tokens: prompt(rng.IntN(9), 64+rng.IntN(4000))})
		}
		for range 20 {
			req := Request{Model: "m", Tokens: prompt(rng.IntN(9), 64+rng.IntN(2000)), NoPrefillCharge: rng.IntN(4) == 0}
			if rng.IntN(3) == 0 {
				req.LoRA = "a"
			}
			for range rng.IntN(3) {
				req.Exclude = append(req.Exclude, key(uint64(rng.IntN(14))))
			}
			for _, fs := range [][]filter{baseFilters, admitFilters} {
				got, gotErr, want, wantErr := filterBothWays(r, req, fs)
				if !slices.Equal(got, want) || fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
					t.Fatalf("round %d, %+v: candidates %v (%v), asking every filter %v (%v)", round, req, got, gotErr, want, wantErr)
				}
			}
		}
	}
}

// filterBothWays runs filter over req's pool, and the same filters asked
// about every worker.
func filterBothWays(r *Router, req Request, fs []filter) (got []int, gotErr error, want []int, wantErr error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.pools[poolKey{req.Model, req.Role.Norm()}]
	local := kv.LocalHashes(nil, req.Tokens, p.blockSize, kv.Seed(req.LoRA, req.Salt))
	s := &selection{r: r, p: p, req: req, seq: kv.SeqHashes(nil, local), now: r.cfg.Now(), cm: r.cfg.Cost}
	gotErr = s.filter(fs)
	got = slices.Clone(s.cand)
	var d drops
	for i, w := range p.workers {
		why := kept
		for _, f := range fs {
			if why = f.drop(s, w); why != kept {
				break
			}
		}
		d[why]++
		if why == kept {
			want = append(want, i)
		}
	}
	if len(want) == 0 {
		wantErr = d.err(&s.req, len(p.workers), r.cfg.BusyRetryAfter)
	}
	return got, gotErr, want, wantErr
}
