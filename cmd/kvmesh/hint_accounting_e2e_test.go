package main

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

var (
	instanceLabel = regexp.MustCompile(`instance="([^"]*)"`)
	outcomeLabels = regexp.MustCompile(`outcome="([^"]*)",reason="([^"]*)"`)
)

// hintLedger reads serve's /metrics: the hints the frontend planned per
// worker instance, the outcomes each worker counted, and the planned hints
// the fleet dropped before they reached a worker.
func hintLedger(t *testing.T, base string) (planned, outcomes map[string]float64, byOutcome map[string]float64, fleetDropped float64) {
	t.Helper()
	planned, outcomes, byOutcome = map[string]float64{}, map[string]float64{}, map[string]float64{}
	for k, v := range testutil.Scrape(t, strings.TrimSuffix(base, "/v1")+"/metrics") {
		inst := ""
		if m := instanceLabel.FindStringSubmatch(k); m != nil {
			inst = m[1]
		}
		switch {
		case strings.HasPrefix(k, "kvmesh_fleet_worker_kv_hints_planned_total{"):
			planned[inst] += v
		case strings.HasPrefix(k, "kvmesh_worker_kv_hint_outcomes_total{"):
			outcomes[inst] += v
			if m := outcomeLabels.FindStringSubmatch(k); m != nil && v > 0 {
				byOutcome[m[1]+"/"+m[2]] += v
			}
		case strings.HasPrefix(k, "kvmesh_fleet_kv_hints_dropped_total{"):
			fleetDropped += v
		}
	}
	return planned, outcomes, byOutcome, fleetDropped
}

// Every planned hint is accounted on a vLLM-adapter fleet (engines that
// report no use): serve --engine vllm over two stand-ins with peer
// endpoints, under shared-prefix bursts (--router-temperature 1 sends some
// extensions to the engine that lacks the prefix, with a hint). Per worker,
// the frontend's planned hints equal the worker's outcomes.
func TestServeVLLMEveryPlannedHintAccounted(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	mocks := []*mockProc{startMockVLLM(t, "mock A"), startMockVLLM(t, "mock B")}
	s := startServe(t, "--engine", "vllm", "--engine-url", mocks[0].url+","+mocks[1].url, "--kv-events", mocks[0].events+","+mocks[1].events,
		"--peer-endpoint", peerService(t)+","+peerService(t), "--router-temperature", "1")
	defer s.stop(t)
	shared := tokenPrompt(24*16, 53000)
	if st, c := completeOnce(t, s.base, map[string]any{"model": "mock-model", "prompt": shared, "max_tokens": 2}); st != 200 {
		t.Fatalf("shared prompt: %d %+v", st, c)
	}
	total := func(m map[string]float64) (n float64) {
		for _, v := range m {
			n += v
		}
		return n
	}
	for round := 0; round < 5; round++ {
		if p, _, _, _ := hintLedger(t, s.base); total(p) > 0 {
			break
		}
		var wg sync.WaitGroup
		for i := range 32 {
			p := append(append([]uint32(nil), shared...), tokenPrompt(16, uint32(90000+1000*round+16*i))...)
			wg.Go(func() {
				resp, err := tryCompletion(context.Background(), s.base, map[string]any{"model": "mock-model", "prompt": p, "max_tokens": 2})
				if err != nil {
					t.Errorf("request %d: %v", i, err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Errorf("request %d: %s", i, resp.Status)
				}
			})
		}
		wg.Wait()
	}
	var planned, outcomes, byOutcome map[string]float64
	var dropped float64
	balanced := func() bool {
		planned, outcomes, byOutcome, dropped = hintLedger(t, s.base)
		if total(planned) == 0 || dropped != 0 {
			return false
		}
		for inst, n := range planned {
			if outcomes[inst] != n {
				return false
			}
		}
		return true
	}
	testutil.WaitFor(t, 10*time.Second, "planned hints = the workers' outcomes, per worker", balanced, func() string {
		return fmt.Sprintf("planned %v, outcomes %v, fleet dropped %v", planned, outcomes, dropped)
	})
	t.Logf("planned %v (total %v); outcomes %v; fleet dropped %v", planned, total(planned), byOutcome, dropped)
	// What the workers call delivered is what the engines received.
	if hs := len(mockHints(t, mocks[0])) + len(mockHints(t, mocks[1])); float64(hs) != byOutcome["delivered/lowered"] {
		t.Fatalf("%d hints reached the engines, %v counted delivered", hs, byOutcome["delivered/lowered"])
	}
}
