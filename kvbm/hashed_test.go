package kvbm

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

// TestHashedRequestsMatchAndOffloadLikeTokens: a request given by its
// blocks' local hashes (an engine without tokens, as the sim replaying a
// trace) matches what the same tokens offloaded, loads it, and offloads
// the blocks its decode completes under the hashes the tokens give; a
// request may not switch between tokens and hashes.
func TestHashedRequestsMatchAndOffloadLikeTokens(t *testing.T) {
	r := newRig(t, func(c *Connector) shape { return trtShape{c.TRTLLMLeader()} }, 32, 0)
	l := r.c.TRTLLMLeader()
	q := req("a", 100, 22) // 5 full blocks and 2 tokens
	r.prefill(q, nil, 64)
	r.sh.finished("a")

	full := append(slices.Clone(q.Tokens), 900, 901, 902) // + 3 decoded tokens
	local, seqs := kv.NewHasher(tBS, "", "").Blocks(full)
	h := &Request{ID: "h", Len: 22, Local: local[:5]}
	if n, async, err := l.GetNumNewMatchedTokens(h, 0); n != 20 || !async || err != nil {
		t.Fatalf("hashed match: %d %v %v, want 20 tokens", n, async, err)
	}
	if _, _, err := l.GetNumNewMatchedTokens(&Request{ID: "h", Tokens: q.Tokens}, 0); err == nil || !strings.Contains(err.Error(), "tokens and by hashes") {
		t.Fatalf("switching to tokens: %v", err)
	}
	if n, _, err := l.GetNumNewMatchedTokens(h, 0); n != 20 || err != nil {
		t.Fatalf("re-match: %d %v", n, err)
	}
	blocks := r.dev.alloc(t, 7)
	if err := l.UpdateStateAfterAlloc("h", blocks, 20); err != nil {
		t.Fatal(err)
	}
	step := func(isNew bool, n, computed, sched int) *Metadata {
		t.Helper()
		d := TRTLLMRequestData{ID: "h", ComputedPosition: computed, Len: n, Local: local[:n/tBS]}
		out := &TRTLLMSchedulerOutput{NumScheduledTokens: map[string]int{"h": sched}}
		if isNew {
			d.NewBlockIDs = blocks
			out.NewRequests = []TRTLLMRequestData{d}
		} else {
			out.CachedRequests = []TRTLLMRequestData{d}
		}
		md, err := l.BuildConnectorMeta(out)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.w.BindConnectorMetadata(md); err != nil {
			t.Fatal(err)
		}
		r.w.WaitForSave()
		if _, _, err := r.w.GetFinished(); err != nil {
			t.Fatal(err)
		}
		return md
	}
	if md := step(true, 22, 20, 2); len(storedSeqs(md)) != 0 {
		t.Fatalf("prefill of the tail stored %d blocks", len(storedSeqs(md)))
	}
	for b := range 5 {
		if string(r.dev.blocks[blocks[b]]) != string(blockPayload(seqs[b])) {
			t.Fatalf("block %d not onboarded", b)
		}
	}
	step(false, 23, 22, 1)
	r.computeBlocks(blocks, seqs, 5, 6)
	md := step(false, 24, 23, 1) // the 24th token completes block 5
	if got := storedSeqs(md); !slices.Equal(got, seqs[5:6]) {
		t.Fatalf("decode stored %x, want block 5 %x", got, seqs[5:6])
	}
	r.checkTierBytes(kv.TierHost, seqs[:6])
}
