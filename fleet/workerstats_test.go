package fleet

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/worker"
)

// Every worker key gets its own series, labelled model, instance, dp_rank
// and role, from its load reports and the requests sent to it; a repeated
// prompt shows up as cached prompt tokens (the actual hit ratio).
func TestPerWorkerSeries(t *testing.T) {
	ctx, nc, disc := controlPlane(t, 2*time.Second)
	cfg := sim.DefaultConfig()
	cfg.BlockSize, cfg.Blocks, cfg.SpeedupRatio, cfg.DPSize = 16, 128, 0, 2
	eng, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w := startWorker(t, ctx, nc, eng, worker.Config{LoadInterval: 20 * time.Millisecond})
	reg := prometheus.NewRegistry()
	cl, model := startCluster(t, ctx, nc, disc, reg)
	inst := natsbus.InstanceToken(w.InstanceID())
	labels := func(rank string) []string {
		return []string{"model", model.Name, "instance", inst, "dp_rank", rank, "role", "aggregated"}
	}
	waitFor(t, 10*time.Second, "load series of both ranks", func() bool {
		return testutil.Value(t, reg, "kvmesh_fleet_worker_kv_blocks", append(labels("1"), "tier", "device")...) == 128 &&
			testutil.Value(t, reg, "kvmesh_fleet_worker_up", labels("0")...) == 1
	})
	prompt := make([]kv.Token, 64)
	for i := range prompt {
		prompt[i] = kv.Token(i + 1)
	}
	send := func(id string) {
		st, err := cl.Generate(context.Background(), &kv.GenerateRequest{RequestID: id, Model: model.Name,
			Tokens: prompt, Sampling: kv.Sampling{MaxTokens: 5, Temperature: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if err := drain(st); err != nil {
			t.Fatal(err)
		}
		st.Close()
	}
	sum := func(name string) float64 { return testutil.Value(t, reg, name, "instance", inst) }
	send("first")
	// Once the router has the first request's KV events, the same prompt
	// goes where its blocks are.
	credited := func(tier string) float64 {
		return testutil.Value(t, reg, "kvmesh_fleet_worker_credited_prompt_tokens_total", "instance", inst, "tier", tier)
	}
	// Both: the engine may hit its cache on a rank the router chose before
	// the first request's events reached it.
	n := 1
	waitFor(t, 10*time.Second, "a cached prompt the router credited", func() bool {
		send("again")
		n++
		return sum("kvmesh_fleet_worker_cached_prompt_tokens_total") >= 48 && credited("device") >= 48
	})
	if got := sum("kvmesh_fleet_worker_requests_total"); got != float64(n) {
		t.Fatalf("requests %v, want %d", got, n)
	}
	if got := sum("kvmesh_fleet_worker_output_tokens_total"); got != float64(5*n) {
		t.Fatalf("output tokens %v, want %d", got, 5*n)
	}
	if got := sum("kvmesh_fleet_worker_prompt_tokens_total"); got != float64(64*n) {
		t.Fatalf("prompt tokens %v, want %d", got, 64*n)
	}
	// What the router credited, by tier: the prompts routed, the repeated
	// ones found on the device, nothing on other tiers or peers.
	if got := sum("kvmesh_fleet_worker_routed_prompt_tokens_total"); got != float64(64*n) {
		t.Fatalf("routed prompt tokens %v, want %d", got, 64*n)
	}
	if dev := credited("device"); dev < 48 || dev > float64(64*(n-1)) {
		t.Fatalf("device credit %v over %d repeats", dev, n-1)
	}
	for _, tier := range []string{"host", "disk", "external", "peer"} {
		if v := credited(tier); v != 0 {
			t.Errorf("%s credit %v", tier, v)
		}
	}
	// What the worker reported it actually served, by tier: all of the
	// cached prompt from the device (a sim without a block manager).
	actual := func(tier string) float64 {
		return testutil.Value(t, reg, "kvmesh_fleet_worker_cached_prompt_tokens_by_tier_total", "instance", inst, "tier", tier)
	}
	if dev, all := actual("device"), sum("kvmesh_fleet_worker_cached_prompt_tokens_total"); dev != all || dev < 48 {
		t.Fatalf("device hits %v, all cached %v", dev, all)
	}
	for _, tier := range []string{"host", "disk", "external", "peer"} {
		if v := actual(tier); v != 0 {
			t.Errorf("%s hits %v", tier, v)
		}
	}
	// The dashboard's status lists both ranks.
	b, _ := json.Marshal(cl.FleetStatus(true))
	if s := string(b); strings.Count(s, `"instance":"`+inst+`"`) != 2 || !strings.Contains(s, `"state":"ready"`) || !strings.Contains(s, `"grpc":"`) {
		t.Fatalf("status %s", s)
	}
	// Without addresses (a reader without an API key), no gRPC address.
	b, _ = json.Marshal(cl.FleetStatus(false))
	if s := string(b); strings.Contains(s, `"grpc"`) || strings.Count(s, `"instance":"`+inst+`"`) != 2 {
		t.Fatalf("status without addresses %s", s)
	}
}
