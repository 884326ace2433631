package sglang

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/enginetest"
	"github.com/kvmesh/kvmesh/engine/remote"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/mockengine"
)

// The SGLang way: the prefill leg answers first with bootstrap_host,
// bootstrap_port (the prefill server's, from /get_server_info) and a
// room; the decode leg sends the same request with them; the decode
// server pulls the prompt's pages from the prefill's bootstrap port and
// the prefill leg ends once it has. The hint goes to the prefill only.
func TestDisaggregatedLegs(t *testing.T) {
	pm, psrv := startMock(t, mockOpts{mode: "prefill"})
	dm, dsrv := startMock(t, mockOpts{mode: "decode"})
	pe := newEngine(t, Config{Config: remote.Config{URL: psrv.URL, Role: kv.RolePrefill}})
	de := newEngine(t, Config{Config: remote.Config{URL: dsrv.URL, Role: kv.RoleDecode}})
	if pe.bootstrapPort != pm.BootstrapPort() || pe.bootstrapAddr() == "" {
		t.Fatalf("bootstrap port %d, the prefill server's %d", pe.bootstrapPort, pm.BootstrapPort())
	}
	hint := &kv.Hint{ID: "sel", Endpoint: "tcp://127.0.0.1:9", Hashes: []kv.EngineHash{1, 2}}
	base := engine.Request{ID: "pd-1", Tokens: enginetest.Prompt(20*16+5, 40), Sampling: kv.Sampling{MaxTokens: 12, Seed: 3}, KVHint: hint}
	preq := base
	preq.Leg = kv.LegPrefill
	pch, err := pe.Generate(context.Background(), &preq)
	if err != nil {
		t.Fatal(err)
	}
	first := <-pch
	if first.Finish != kv.FinishNone || len(first.TransferParams) == 0 {
		t.Fatalf("prefill's first chunk %+v", first)
	}
	bs, err := ParseBootstrap(first.TransferParams)
	if err != nil || bs.Host != "127.0.0.1" || bs.Port != pm.BootstrapPort() || bs.Room == nil {
		t.Fatalf("bootstrap %s: %+v %v", first.TransferParams, bs, err)
	}
	dreq := base
	dreq.Leg, dreq.TransferParams = kv.LegDecode, first.TransferParams
	dch, err := de.Generate(context.Background(), &dreq)
	if err != nil {
		t.Fatal(err)
	}
	toks, last, _ := enginetest.Collect(t, dch)
	if len(toks) != 12 || last.Finish != kv.FinishLength || last.Usage.CachedTokens != 20*16 {
		t.Fatalf("decode: %d tokens, %+v usage %+v", len(toks), last, last.Usage)
	}
	ptoks, plast, _ := enginetest.Collect(t, pch)
	if len(ptoks) != 0 || plast.Finish == kv.FinishNone || plast.Err != nil {
		t.Fatalf("prefill leg's end: %d tokens %+v", len(ptoks), plast)
	}
	if ps := dm.PullStats(); ps.OK != 1 || ps.Blocks != 20 {
		t.Fatalf("decode pulls %+v", ps)
	}
	if ls := pm.LeaseStats(0); ls.Consumed != 1 {
		t.Fatalf("prefill leases %+v", ls)
	}
	if len(pm.Hints()) != 1 || len(dm.Hints()) != 0 {
		t.Fatalf("hints: prefill %d, decode %d", len(pm.Hints()), len(dm.Hints()))
	}
	// A decode server cannot compute a prompt alone.
	whole := base
	if _, err := de.Generate(context.Background(), &whole); err == nil || !strings.Contains(err.Error(), "cannot prefill a request alone") {
		t.Fatalf("a whole request on a decode server: %v", err)
	}
	// A decode leg without usable bootstrap parameters is the request's
	// fault.
	for _, bad := range []string{``, `[]`, `{"bootstrap_host":"h","bootstrap_port":1}`, `{"bootstrap_port":1,"bootstrap_room":2}`} {
		r := base
		r.Leg, r.TransferParams = kv.LegDecode, []byte(bad)
		if _, err := de.Generate(context.Background(), &r); err == nil || !strings.Contains(err.Error(), "bootstrap") {
			t.Fatalf("params %q: %v", bad, err)
		}
	}
}

// SGLang's KV events (batches without a DP rank, signed hashes) relayed
// into the worker's sink: the engine hashes arrive bit for bit, negative
// ones included, with kvmesh's local hashes recomputed from the tokens.
func TestEventsRelayedWithSignedHashes(t *testing.T) {
	m, srv := startMock(t, mockOpts{events: true})
	e := newEngine(t, Config{Config: remote.Config{URL: srv.URL, Events: m.EventsEndpoint(0), ReplayEvents: m.ReplayEndpoint(0)}})
	got := make(chan []kv.Event, 64)
	e.SetEventSink(func(b []kv.Event) { got <- b })
	toks := enginetest.Prompt(12*16, 500)
	ch, err := e.Generate(context.Background(), &engine.Request{Tokens: toks, Sampling: kv.Sampling{MaxTokens: 1}})
	if err != nil {
		t.Fatal(err)
	}
	enginetest.Collect(t, ch)
	local, seqs := kv.NewHasher(16, "", "").Blocks(toks)
	want := map[kv.EngineHash]kv.LocalHash{}
	negative := 0
	for i, s := range seqs {
		h := mockengine.EngineHash(s)
		want[h] = local[i]
		if int64(h) < 0 {
			negative++
		}
	}
	if negative == 0 {
		t.Fatal("no negative hash in the test prompt; pick another")
	}
	// The relay's subscription may join after those batches went out
	// (ZMQ's slow joiner): a later live batch makes it catch up through
	// replay, so poke the engine until everything has arrived.
	timeout := time.After(10 * time.Second)
	poke := time.NewTicker(200 * time.Millisecond)
	defer poke.Stop()
	pokes := 0
	for len(want) > 0 {
		select {
		case <-poke.C:
			pokes++
			ch, err := e.Generate(context.Background(), &engine.Request{Tokens: enginetest.Prompt(16, kv.Token(90000+16*pokes)), Sampling: kv.Sampling{MaxTokens: 1}})
			if err != nil {
				t.Fatal(err)
			}
			enginetest.Collect(t, ch)
		case b := <-got:
			for _, ev := range b {
				for _, bl := range ev.Blocks {
					if l, ok := want[bl.EngineHash]; ok {
						if bl.LocalHash != l {
							t.Fatalf("block %d: local hash %x, want %x", int64(bl.EngineHash), bl.LocalHash, l)
						}
						delete(want, bl.EngineHash)
					}
				}
			}
		case <-timeout:
			t.Fatalf("%d stored blocks never relayed (relay %+v)", len(want), e.Relay().Stats())
		}
	}
}
