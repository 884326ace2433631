package router

import (
	"context"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

// A request carrying its local hashes (and only its length) routes exactly
// like the same request given by its tokens: same worker, overlap, hashes
// and booked load; so does one carrying its sequence hashes too.
func TestRoutePrecomputedLocal(t *testing.T) {
	toks := prompt(7, 5*testBS+3)
	local, seq := kv.NewHasher(testBS, "lora", "salt").Blocks(toks)
	run := func(req Request) (*Decision, []WorkerLoad) {
		t.Helper()
		ix := newFakeIndex()
		ix.store(key(2), kv.TierDevice, seq[:3])
		r := newRouter(t, Config{Matcher: ix})
		for i := range uint64(3) {
			w := winfo(i + 1)
			w.LoRAs = []string{"lora"}
			if err := r.AddWorker(w); err != nil {
				t.Fatal(err)
			}
		}
		d, err := r.Route(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		return d, r.Loads()
	}
	d1, l1 := run(Request{Model: "m", Tokens: toks, LoRA: "lora", Salt: "salt"})
	d2, l2 := run(Request{Model: "m", Local: local, PromptLen: len(toks), LoRA: "lora", Salt: "salt"})
	d3, l3 := run(Request{Model: "m", Local: local, Seq: seq, PromptLen: len(toks), LoRA: "lora", Salt: "salt"})
	if d3.Worker != d1.Worker || d3.Overlap != d1.Overlap || d3.CachedTokens != d1.CachedTokens || &d3.Seq[0] != &seq[0] {
		t.Fatalf("tokens: %+v\nlocal and seq: %+v", d1, d3)
	}
	if d1.Worker != key(2) || d2.Worker != d1.Worker || d2.Overlap != d1.Overlap || d2.ISL != d1.ISL ||
		d2.CachedTokens != d1.CachedTokens || d2.PrefillTokens != d1.PrefillTokens {
		t.Fatalf("tokens: %+v\nlocal: %+v", d1, d2)
	}
	if len(d2.Seq) != len(seq) || len(d2.Local) != len(local) {
		t.Fatalf("hashes: %d/%d seq, %d/%d local", len(d2.Seq), len(seq), len(d2.Local), len(local))
	}
	for i := range seq {
		if d2.Seq[i] != seq[i] || d1.Seq[i] != seq[i] || d2.Local[i] != local[i] {
			t.Fatalf("block %d: seq %x/%x/%x", i, d1.Seq[i], d2.Seq[i], seq[i])
		}
	}
	for i := range l1 {
		if l1[i] != l2[i] || l1[i] != l3[i] {
			t.Fatalf("load %d: %+v vs %+v vs %+v", i, l1[i], l2[i], l3[i])
		}
	}
	d1.Done()
	d2.Done()
	d3.Done()
}

func TestRoutePrecomputedLocalErrors(t *testing.T) {
	r := newRouter(t, Config{Matcher: newFakeIndex()}, 1)
	local, seq := kv.NewHasher(testBS, "", "").Blocks(prompt(1, 4*testBS))
	for name, req := range map[string]Request{
		"too few sequence hashes": {Model: "m", Local: local, Seq: seq[:3], PromptLen: 4 * testBS},
		"too few hashes":          {Model: "m", Local: local[:3], PromptLen: 4 * testBS},
		"too many hashes":         {Model: "m", Local: local, PromptLen: 4*testBS - 1},
		"negative length":         {Model: "m", Local: local[:0], PromptLen: -1},
	} {
		if d, err := r.Route(context.Background(), req); err == nil {
			d.Done()
			t.Errorf("%s: routed", name)
		}
	}
	// A short prompt has no full block: an empty (non-nil) Local is right.
	d, err := r.Route(context.Background(), Request{Model: "m", Local: []kv.LocalHash{}, PromptLen: testBS - 1})
	if err != nil {
		t.Fatal(err)
	}
	if d.ISL != testBS-1 || len(d.Local) != 0 {
		t.Fatalf("short prompt: %+v", d)
	}
	d.Done()
}
