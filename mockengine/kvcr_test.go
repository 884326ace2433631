package mockengine

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/enginetest"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/kvcr"
)

// TestKVCRInventoryFromTheSim: the sim's block-manager tiers, published as
// a linker's inventory (host as CPU, disk as STORAGE, SGLang's signed
// hashes), reach a router's index through the state agent on the right
// tiers, and device blocks stay off the inventory.
func TestKVCRInventoryFromTheSim(t *testing.T) {
	cfg := testSim()
	cfg.KVBM = &sim.KVBMConfig{HostBlocks: 64, DiskBlocks: 64, DiskDir: t.TempDir()}
	cfg.KVBM.DiskFilter.Disabled = true // every host block goes on to disk
	e, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	inv, err := NewKVCRInventory(ctx, KVCRConfig{Endpoint: "tcp://127.0.0.1:0", Owner: "sim-owner", HashDomain: kvcr.HashDomainSGLang}, cfg.BlockSize, quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer inv.Close()
	var devMu sync.Mutex
	var device []kv.Event
	e.SetEventSink(inv.Split(func(evs []kv.Event) {
		devMu.Lock()
		device = append(device, evs...)
		devMu.Unlock()
	}))

	a, err := kvcr.NewAgent(kvcr.AgentConfig{Endpoint: inv.Endpoint(), Descriptor: inv.Descriptor(),
		Expect: kvcr.Expect{BlockSize: cfg.BlockSize, HashDomain: kvcr.HashDomainSGLang}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var mu sync.Mutex
	ix := index.New()
	a.SetEventSink(func(evs []kv.Event) {
		mu.Lock()
		defer mu.Unlock()
		for _, ev := range evs {
			ix.Apply(ev)
		}
	})
	// Subscriptions land asynchronously; the prompt goes once the agent is
	// connected (an empty inventory clear is re-sent until it arrives).
	testutil.WaitFor(t, 5*time.Second, "agent subscribed", func() bool { _ = inv.pub.Clear(); return a.Stats().Epochs > 0 })

	prompt := seqTokens(6*cfg.BlockSize, 100)
	if err := enginetest.Run(ctx, e, &engine.Request{ID: "p", Tokens: prompt, Sampling: kv.Sampling{MaxTokens: 1, Seed: 1}}); err != nil {
		t.Fatal(err)
	}
	local, _ := kv.NewHasher(cfg.BlockSize, "", "").Blocks(prompt)
	testutil.WaitFor(t, 5*time.Second, "host and disk credited", func() bool {
		mu.Lock()
		defer mu.Unlock()
		m := ix.FindMatches(local, nil)
		return len(m) == 1 && m[0].Depth[kv.TierHost] == 6 && m[0].Depth[kv.TierDisk] == 6
	}, func() string {
		mu.Lock()
		defer mu.Unlock()
		return fmtMatches(ix.FindMatches(local, nil))
	})
	mu.Lock()
	m := ix.FindMatches(local, nil)
	c := ix.BlockCounts(m[0].Worker)
	mu.Unlock()
	if m[0].Depth[kv.TierDevice] != 0 || c[kv.TierDevice] != 0 || c[kv.TierHost] != 6 || c[kv.TierDisk] != 6 {
		t.Fatalf("inventory credited %v per tier (device must stay on the engine's own events)", c)
	}
	devMu.Lock()
	defer devMu.Unlock()
	for _, ev := range device {
		if ev.Kind != kv.EventCleared && ev.Tier != kv.TierDevice {
			t.Fatalf("a %v event went to the engine's own events", ev.Tier)
		}
	}
	if len(device) == 0 {
		t.Fatal("no device events reached the engine's own sink")
	}
	if st := a.Stats(); st.UnknownMedia != 0 || st.DroppedEvents != 0 || st.TruncatedStores != 0 {
		t.Fatalf("agent: %+v", st)
	}
}

func fmtMatches(ms []index.Match) string {
	out := ""
	for _, m := range ms {
		out += fmt.Sprintf("%v depth %v; ", m.Worker, m.Depth)
	}
	return out
}
