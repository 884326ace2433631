package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
)

// `kvmesh serve --dp-size 2`: the worker registers two DP ranks with a
// control endpoint each; a repeated chat is routed back to the rank that
// cached it (cached tokens in its usage), and only that rank holds the
// prompt's blocks.
func TestServeDPRanks(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvmesh serve")
	}
	s := startServe(t, "--workers", "1", "--dp-size", "2", "--speedup-ratio", "0", "--block-size", "16")
	defer s.stop(t)
	ws := watchWorkers(t, s.natsURL, simModel, 1)
	in := ws.watcher.Instances()[0]
	if in.DPSize != 2 || len(in.ControlEndpoints) != 2 {
		t.Fatalf("instance dp size %d, control endpoints %v", in.DPSize, in.ControlEndpoints)
	}
	client := newClient(s.base)
	content := strings.Repeat("Data-parallel ranks keep their own KV caches. ", 20)
	first := chatOnce(t, client, chatParams(content, 3, 4))
	// The router learns where the prompt is cached from the rank's KV
	// events, which travel over NATS after the answer may have come back.
	testutil.WaitFor(t, 10*time.Second, "the first prompt's KV events at the router", func() bool {
		n, _ := metric(t, s.base, `kvmesh_event_feed_events_applied_total{model="`+simModel+`"}`)
		return n > 0
	})
	second := chatOnce(t, client, chatParams(content, 3, 4))
	if first.Usage.PromptTokensDetails.CachedTokens != 0 || second.Usage.PromptTokensDetails.CachedTokens < 16 {
		t.Fatalf("cached tokens %d then %d, want 0 then ≥ 16", first.Usage.PromptTokensDetails.CachedTokens, second.Usage.PromptTokensDetails.CachedTokens)
	}
	c, err := ws.clients.Get(in)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var holding []int
	for rank := range 2 {
		d, err := c.Dump(ctx, &api.DumpRequest{Worker: api.KeyToProto(kv.WorkerKey{Instance: in.ID, DPRank: uint32(rank)})})
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Events) > 0 {
			holding = append(holding, rank)
		}
	}
	if len(holding) != 1 {
		t.Fatalf("ranks holding blocks: %v, want exactly one", holding)
	}
}
