package main

import (
	"context"
	"strings"
	"testing"
)

// TestTwinRouterCost: --router-cost picks the cost model (blocks and time
// route the slice differently), bad names are refused with the flag named.
func TestTwinRouterCost(t *testing.T) {
	hit := map[string]string{}
	for _, kind := range []string{"blocks", "time", ""} {
		args := []string{"--trace", "../../twin/testdata/conversation_300.jsonl", "--router", "kv"}
		if kind != "" {
			args = append(args, "--router-cost", kind)
		}
		out, errOut, err := runTwinCmd(t, args...)
		if err != nil {
			t.Fatalf("%q: %v\n%s", kind, err, errOut)
		}
		i, j := strings.Index(out, "hit="), strings.Index(out, " wall_s=")
		if i < 0 || j < i {
			t.Fatalf("%q: no summary line:\n%s", kind, out)
		}
		hit[kind] = out[i:j]
	}
	if hit["blocks"] == hit["time"] || hit[""] != hit["time"] {
		t.Fatalf("hit by cost: %v (default should be time)", hit)
	}
	if _, _, err := runTwinCmd(t, "--trace", "../../twin/testdata/conversation_300.jsonl", "--router-cost", "latency"); err == nil || !strings.Contains(err.Error(), "--router-cost") {
		t.Fatalf("bad --router-cost: %v", err)
	}
}

func TestFrontendRouterCostFlag(t *testing.T) {
	ff := &frontendFlags{routerMode: "kv", routerCost: "latency"}
	if _, err := startFrontendOn(context.Background(), ff, nil, nil, nil, nil); err == nil || !strings.Contains(err.Error(), "--router-cost") {
		t.Fatalf("bad --router-cost: %v", err)
	}
}

func TestFrontendTierLoadFlag(t *testing.T) {
	ff := &frontendFlags{routerMode: "kv", tierLoadMS: "host=fast", localPrefillRatio: 0.5, maxBodyBytes: 1}
	if err := ff.validate(); err == nil || !strings.Contains(err.Error(), "--router-tier-load-ms") {
		t.Fatalf("bad --router-tier-load-ms at the start check: %v", err)
	}
	if _, err := startFrontendOn(context.Background(), ff, nil, nil, nil, nil); err == nil || !strings.Contains(err.Error(), "--router-tier-load-ms") {
		t.Fatalf("bad --router-tier-load-ms: %v", err)
	}
}
