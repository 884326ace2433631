package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/worker"
)

// Under a burst against an in-process fleet like `kvmesh serve` (three sim
// workers serving their caches to each other, hint planning on), with
// requests cancelled mid-stream and a worker leaving mid-burst, every hint
// the router planned ends in exactly one counted outcome: dropped before a
// worker (by the fleet, with a reason) or a worker's result.
func TestEveryPlannedHintIsCountedOnce(t *testing.T) {
	f := startHintedFleet(t, 3, func(cfg *sim.Config) { cfg.SpeedupRatio = 1 },
		worker.Config{LoadInterval: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	ctx, ws, reg := f.ctx, f.ws, f.reg
	// A high temperature spreads requests away from the workers holding
	// their prefix, so the router plans many hints.
	cost := router.BlockCost()
	cost.Temperature = 50
	c := f.cluster(t, router.Config{Hints: true, Cost: &cost}, reg)

	// Conversations over a few shared system prompts: later turns find
	// their prefix on a worker the router may not pick.
	systems := [][]uint32{prompt(1, 2048), prompt(2, 2048)}
	const requests, parallel = 90, 12
	var wg sync.WaitGroup
	sem := make(chan struct{}, parallel)
	var mu sync.Mutex
	outcomes := map[string]int{}
	for i := range requests {
		if i == requests/2 {
			ws[2].w.Close() // a worker leaves mid-burst: its hints end where they were
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			toks := concat(systems[i%len(systems)], prompt(uint64(100+i%7), 64*(1+i%5)))
			rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
			defer rcancel()
			st, err := c.Generate(rctx, &kv.GenerateRequest{RequestID: fmt.Sprint("burst-", i), Model: hintedModel,
				Tokens: toks, Sampling: kv.Sampling{MaxTokens: 16}})
			out := "ok"
			defer func() { mu.Lock(); outcomes[out]++; mu.Unlock() }()
			if err != nil {
				out = "error"
				return
			}
			defer st.Close()
			if i%6 == 5 { // the client leaves as soon as its request is sent
				out = "cancelled early"
				rcancel()
				return
			}
			for {
				ch, err := st.Recv()
				if errors.Is(err, io.EOF) || ch.Finish != "" {
					return
				}
				if err != nil {
					out = "lost"
					return
				}
				if i%4 == 3 && len(ch.Tokens) > 0 { // the client leaves after its first token
					out = "cancelled"
					rcancel()
					return
				}
			}
		}()
	}
	wg.Wait()

	results := []string{worker.HintFetched, worker.HintPartial, worker.HintFallback, worker.HintUnused,
		worker.HintMalformed, worker.HintIgnored, worker.HintDropped}
	var planned, dropped, ended float64
	account := func() string {
		m := gatherMetrics(t, reg)
		planned = m["kvmesh_router_hints_planned_total"]
		dropped = testutil.Value(t, reg, "kvmesh_fleet_kv_hints_dropped_total")
		ended = 0
		s := ""
		for _, r := range results {
			v := m[`kvmesh_kv_hint_results_total{result="`+r+`"}`]
			ended += v
			s += fmt.Sprintf(" %s=%v", r, v)
		}
		return fmt.Sprintf("planned %v, dropped before a worker %v, worker results %v (%s); requests %v", planned, dropped, ended, s, outcomes)
	}
	// A cancelled stream's worker settles its hint when its handler returns.
	waitFor(t, 10*time.Second, "every planned hint counted once", func() bool {
		account()
		return planned == dropped+ended
	}, account)
	t.Log(account())
	if planned < 5 {
		t.Fatalf("the burst planned only %v hints: %s", planned, account())
	}
}
