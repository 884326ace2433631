package kvbm

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

func newReq(r *Request, blocks []DeviceBlockID, computed int) stepReq {
	return stepReq{req: r, id: r.ID, tokens: r.Tokens, blocks: blocks, computed: computed}
}

func cachedReq(id string, toks []kv.Token, blocks []DeviceBlockID, computed int) stepReq {
	return stepReq{id: id, tokens: toks, blocks: blocks, computed: computed}
}

// prefill runs a request with no external hit through chunked prefill in
// chunks of at most chunk tokens, filling the device blocks as each step
// completes them, and returns its device blocks.
func (r *rig) prefill(q *Request, deviceHit []DeviceBlockID, chunk int) []DeviceBlockID {
	r.t.Helper()
	computed := len(deviceHit) * tBS
	if n, _, err := r.sh.match(q, computed); err != nil || n != 0 {
		r.t.Fatalf("match %s: %d %v, want 0", q.ID, n, err)
	}
	blocks := append(slices.Clone(deviceHit), r.dev.alloc(r.t, kv.BlocksNeeded(len(q.Tokens)+1, tBS)-len(deviceHit))...)
	if err := r.sh.alloc(q.ID, blocks, 0, computed); err != nil {
		r.t.Fatal(err)
	}
	seqs := seqsOf(q)
	first := true
	for computed < len(q.Tokens) {
		n := min(chunk, len(q.Tokens)-computed)
		c := computed
		fwd := func() { r.computeBlocks(blocks, seqs, c/tBS, (c+n)/tBS) }
		if first {
			r.run([]stepReq{newReq(q, blocks, computed)}, nil, map[string]int{q.ID: n}, fwd)
			first = false
		} else {
			r.run(nil, []stepReq{cachedReq(q.ID, nil, nil, computed)}, map[string]int{q.ID: n}, fwd)
		}
		computed += n
	}
	return blocks
}

func TestChunkedPrefillOffloadsEachBlockOnce(t *testing.T) {
	forEachShape(t, func(t *testing.T, mk func(*Connector) shape) {
		r := newRig(t, mk, 32, 0)
		q := req("a", 100, 22) // 5 full blocks and 2 tokens
		seqs := seqsOf(q)
		if n, async, err := r.sh.match(q, 0); n != 0 || async || err != nil {
			t.Fatalf("empty tiers matched %d %v %v", n, async, err)
		}
		blocks := r.dev.alloc(t, 6)
		if err := r.sh.alloc("a", blocks, 0, 0); err != nil {
			t.Fatal(err)
		}
		// Chunks of 7, 7, 8 tokens, then two decode steps.
		want := [][]kv.SeqHash{seqs[0:1], seqs[1:3], seqs[3:5], nil, nil}
		computed := 0
		var tok kv.Token = 9000
		toks := slices.Clone(q.Tokens)
		for i, n := range []int{7, 7, 8, 1, 1} {
			c := computed
			var st stepReq
			switch {
			case i == 0:
				st = newReq(q, blocks, 0)
			case c >= len(q.Tokens):
				// Decode: the token sampled by the previous step.
				toks = append(toks, tok)
				st = cachedReq("a", []kv.Token{tok}, nil, c)
				tok++
			default:
				st = cachedReq("a", nil, nil, c)
			}
			_, full := kv.NewHasher(tBS, "", "").Blocks(toks)
			fwd := func() { r.computeBlocks(blocks, full, c/tBS, (c+n)/tBS) }
			var md *Metadata
			if i == 0 {
				md, _, _ = r.run([]stepReq{st}, nil, map[string]int{"a": n}, fwd)
			} else {
				md, _, _ = r.run(nil, []stepReq{st}, map[string]int{"a": n}, fwd)
			}
			got := storedSeqs(md)
			if i == 4 {
				// The second decode step completes block 5 (tokens 20..23).
				want[4] = full[5:6]
			}
			if fmt.Sprint(got) != fmt.Sprint(want[i]) {
				t.Fatalf("step %d: stored %v, want %v", i, got, want[i])
			}
			computed += n
		}
		_, all := kv.NewHasher(tBS, "", "").Blocks(toks)
		r.checkTierBytes(kv.TierHost, all)
		st := r.m.Stats()
		if st.OffloadedHost != 6 || st.DedupHost != 0 || st.HostBlocks != 6 {
			t.Fatalf("stats %+v: want 6 offloaded once each", st)
		}
		info, _ := r.c.Slot("a")
		if info.Evaluated != 6 || info.Current != 24 || info.Phase != PhaseDecoding {
			t.Fatalf("slot %+v", info)
		}
		if r.sh.finished("a") {
			t.Fatal("a request with nothing in flight must free at once")
		}
		if r.c.Slots() != 0 {
			t.Fatal("finished slot kept")
		}
	})
}

func TestPrefixHitOnDeviceIsNotOffloadedAgain(t *testing.T) {
	forEachShape(t, func(t *testing.T, mk func(*Connector) shape) {
		r := newRig(t, mk, 32, 0)
		a := req("a", 100, 22)
		aBlocks := r.prefill(a, nil, 8)
		// b shares a's first 3 blocks, which the engine finds on its device.
		b := req("b", 100, 12)
		b.Tokens = append(b.Tokens, 7, 7, 7, 7, 7, 7, 7)
		before := r.m.Stats()
		md := len(r.metas)
		r.prefill(b, aBlocks[:3], 16)
		var stored []kv.SeqHash
		for _, m := range r.metas[md:] {
			stored = append(stored, storedSeqs(m)...)
		}
		seqs := seqsOf(b)
		if fmt.Sprint(stored) != fmt.Sprint(seqs[3:]) {
			t.Fatalf("stored %v, want only the blocks after the device hit %v", stored, seqs[3:])
		}
		after := r.m.Stats()
		if after.DedupHost != before.DedupHost || after.OffloadedHost-before.OffloadedHost != 1 {
			t.Fatalf("device hit offloaded again: %+v → %+v", before, after)
		}
	})
}

func TestOnboardThenDecode(t *testing.T) {
	forEachShape(t, func(t *testing.T, mk func(*Connector) shape) {
		r := newRig(t, mk, 32, 0)
		a := req("a", 100, 13)
		aBlocks := r.prefill(a, nil, 16)
		if r.sh.finished("a") {
			t.Fatal("delay without ops")
		}
		r.dev.release(aBlocks)

		// A prompt that is exactly the host's 3 blocks leaves one to compute.
		whole := req("w", 100, 12)
		if n, async, err := r.sh.match(whole, 0); n != 8 || !async || err != nil {
			t.Fatalf("whole-prompt match: %d %v %v, want 8 tokens", n, async, err)
		}
		r.sh.finished("w") // releases the staged blocks

		b := req("b", 100, 19)
		seqs := seqsOf(b)
		n, async, err := r.sh.match(b, 0)
		if n != 12 || !async || err != nil {
			t.Fatalf("match: %d %v %v, want 12 async", n, async, err)
		}
		// Repeating the call is harmless.
		if n2, _, _ := r.sh.match(b, 0); n2 != 12 {
			t.Fatalf("second match %d", n2)
		}
		ext := r.dev.alloc(t, 3)
		if err := r.sh.alloc("b", ext, 12, 0); err != nil {
			t.Fatal(err)
		}
		md, _, recv := r.run(nil, nil, map[string]int{}, nil)
		if len(md.NewSlots) != 1 || md.NewSlots[0] != (NewSlot{"b", 1}) || len(md.Ops) != 1 || md.Ops[0].Kind != OpLoad {
			t.Fatalf("metadata %+v", md)
		}
		if fmt.Sprint(recv) != "[b]" {
			t.Fatalf("finished receiving %v", recv)
		}
		for i, id := range ext {
			if string(r.dev.blocks[id]) != string(blockPayload(seqs[i])) {
				t.Fatalf("device block %d does not hold block %d's KV", id, i)
			}
		}
		if bad := r.w.BlockIDsWithLoadErrors(); len(bad) != 0 {
			t.Fatalf("load errors %v", bad)
		}
		more := r.dev.alloc(t, 2)
		if err := r.sh.alloc("b", more, 0, 12); err != nil {
			t.Fatal(err)
		}
		blocks := append(slices.Clone(ext), more...)
		md, _, _ = r.run([]stepReq{newReq(b, blocks, 12)}, nil, map[string]int{"b": 7},
			func() { r.computeBlocks(blocks, seqs, 3, 4) })
		if got := storedSeqs(md); fmt.Sprint(got) != fmt.Sprint(seqs[3:4]) {
			t.Fatalf("after onboarding stored %v, want only block 3", got)
		}
		// Decode one token: it completes block 4.
		toks := append(slices.Clone(b.Tokens), 4242)
		_, full := kv.NewHasher(tBS, "", "").Blocks(toks)
		md, _, _ = r.run(nil, []stepReq{cachedReq("b", []kv.Token{4242}, nil, 19)}, map[string]int{"b": 1},
			func() { r.computeBlocks(blocks, full, 4, 5) })
		if got := storedSeqs(md); fmt.Sprint(got) != fmt.Sprint(full[4:5]) {
			t.Fatalf("decode stored %v, want block 4", got)
		}
		r.checkTierBytes(kv.TierHost, full)
		info, _ := r.c.Slot("b")
		if info.LoadedHost != 12 || info.LoadedDisk != 0 || info.Evaluated != 5 {
			t.Fatalf("slot %+v", info)
		}
		st := r.m.Stats()
		if st.OnboardedHost != 3 || st.MatchedHost < 3 {
			t.Fatalf("stats %+v", st)
		}
	})
}

func TestPreemptionResumesWithoutOffloadingTwice(t *testing.T) {
	forEachShape(t, func(t *testing.T, mk func(*Connector) shape) {
		r := newRig(t, mk, 32, 0)
		q := req("a", 100, 22)
		seqs := seqsOf(q)
		if n, _, _ := r.sh.match(q, 0); n != 0 {
			t.Fatal("empty match")
		}
		blocks := r.dev.alloc(t, 6)
		if err := r.sh.alloc("a", blocks, 0, 0); err != nil {
			t.Fatal(err)
		}
		md, _, _ := r.run([]stepReq{newReq(q, blocks, 0)}, nil, map[string]int{"a": 9},
			func() { r.computeBlocks(blocks, seqs, 0, 2) })
		if len(storedSeqs(md)) != 2 {
			t.Fatalf("first chunk stored %v", storedSeqs(md))
		}
		// The engine preempts it: frees its blocks, and later matches it
		// again as a waiting request.
		r.dev.release(blocks)
		n, async, err := r.sh.match(q, 0)
		if n != 8 || !async || err != nil {
			t.Fatalf("re-match after preemption: %d %v %v", n, async, err)
		}
		if info, _ := r.c.Slot("a"); info.Phase != PhaseOnboardStaged || len(info.DeviceBlocks) != 0 {
			t.Fatalf("slot after preemption %+v", info)
		}
		ext := r.dev.alloc(t, 2)
		if err := r.sh.alloc("a", ext, 8, 0); err != nil {
			t.Fatal(err)
		}
		if _, _, recv := r.run(nil, nil, map[string]int{}, nil); fmt.Sprint(recv) != "[a]" {
			t.Fatalf("recv %v", recv)
		}
		more := r.dev.alloc(t, 4)
		if err := r.sh.alloc("a", more, 0, 8); err != nil {
			t.Fatal(err)
		}
		all := append(slices.Clone(ext), more...)
		md, _, _ = r.run(nil, []stepReq{{id: "a", blocks: all, computed: 8, resumed: true}}, map[string]int{"a": 14},
			func() { r.computeBlocks(all, seqs, 2, 5) })
		if got := storedSeqs(md); fmt.Sprint(got) != fmt.Sprint(seqs[2:5]) {
			t.Fatalf("resumed stored %v, want blocks 2..4 %v", got, seqs[2:5])
		}
		r.checkTierBytes(kv.TierHost, seqs)
		if st := r.m.Stats(); st.OffloadedHost != 5 || st.DedupHost != 0 {
			t.Fatalf("stats %+v", st)
		}
	})
}

func TestFinishWhileOffloading(t *testing.T) {
	forEachShape(t, func(t *testing.T, mk func(*Connector) shape) {
		r := newRig(t, mk, 32, 0)
		q := req("a", 100, 9)
		seqs := seqsOf(q)
		r.sh.match(q, 0)
		blocks := r.dev.alloc(t, 3)
		if err := r.sh.alloc("a", blocks, 0, 0); err != nil {
			t.Fatal(err)
		}
		md, err := r.sh.step([]stepReq{newReq(q, blocks, 0)}, nil, map[string]int{"a": 9})
		if err != nil || len(storedSeqs(md)) != 2 {
			t.Fatalf("%v %v", err, md)
		}
		if err := r.w.BindConnectorMetadata(md); err != nil {
			t.Fatal(err)
		}
		r.computeBlocks(blocks, seqs, 0, 2)
		r.w.WaitForSave()
		// The request samples its only token and finishes while its stores
		// are still queued: the engine must keep its blocks.
		if !r.sh.finished("a") {
			t.Fatal("finish with stores in flight must delay the free")
		}
		if info, _ := r.c.Slot("a"); info.Phase != PhaseFinishing || info.Pending != 1 {
			t.Fatalf("slot %+v", info)
		}
		// A later step does not touch a finishing slot.
		if md, err := r.sh.step(nil, nil, map[string]int{}); err != nil || len(md.Ops) != 0 {
			t.Fatalf("%v %+v", err, md)
		}
		sending, recving, err := r.w.GetFinished()
		if err != nil || fmt.Sprint(sending) != "[a]" || len(recving) != 0 {
			t.Fatalf("sending %v recving %v err %v", sending, recving, err)
		}
		r.dev.release(blocks)
		if r.c.Slots() != 0 {
			t.Fatal("slot kept after finished sending")
		}
		r.checkTierBytes(kv.TierHost, seqs)

		// Finishing while staged releases the pins.
		q2 := req("b", 100, 13)
		if n, _, _ := r.sh.match(q2, 0); n != 8 {
			t.Fatalf("match %d", n)
		}
		if r.sh.finished("b") {
			t.Fatal("staged only: nothing in flight")
		}
		for _, s := range r.m.host.slots {
			if s.ref != 0 {
				t.Fatal("a pin survived the finish")
			}
		}
	})
}

func TestMissingNumScheduledTokensNamesTheRequest(t *testing.T) {
	forEachShape(t, func(t *testing.T, mk func(*Connector) shape) {
		r := newRig(t, mk, 8, 0)
		a, b := req("req-a", 1, 8), req("req-b", 50, 8)
		for _, q := range []*Request{a, b} {
			r.sh.match(q, 0)
			if err := r.sh.alloc(q.ID, r.dev.alloc(t, 2), 0, 0); err != nil {
				t.Fatal(err)
			}
		}
		ia, _ := r.c.Slot("req-a")
		_, err := r.sh.step([]stepReq{newReq(a, ia.DeviceBlocks, 0), newReq(b, nil, 0)}, nil, map[string]int{"req-a": 8})
		if err == nil || !strings.Contains(err.Error(), `"req-b"`) || !strings.Contains(err.Error(), "num_scheduled_tokens") {
			t.Fatalf("error %v, want one naming req-b", err)
		}
		if info, _ := r.c.Slot("req-a"); info.Current != 0 || info.Evaluated != 0 {
			t.Fatalf("a failed step changed state: %+v", info)
		}
	})
}

func TestGenerationOnlyMatchesNothing(t *testing.T) {
	forEachShape(t, func(t *testing.T, mk func(*Connector) shape) {
		r := newRig(t, mk, 32, 0)
		a := req("a", 100, 13)
		r.prefill(a, nil, 16)
		d := req("d", 100, 13)
		d.GenerationOnly = true
		if n, async, err := r.sh.match(d, 0); n != 0 || async || err != nil {
			t.Fatalf("decode-side request matched %d %v %v", n, async, err)
		}
		if r.m.Stats().MatchedHost != 0 {
			t.Fatal("nothing may be pinned for a generation-only request")
		}
	})
}

func TestCorruptHostBlockStopsTheLoad(t *testing.T) {
	forEachShape(t, func(t *testing.T, mk func(*Connector) shape) {
		r := newRig(t, mk, 32, 0)
		a := req("a", 100, 13)
		r.dev.release(r.prefill(a, nil, 16))
		seqs := seqsOf(a)
		s1, _ := r.m.host.lookup(seqs[1])
		r.m.cfg.Host.(*HostArena).View(int(s1))[17] ^= 0x40

		b := req("b", 100, 20)
		if n, _, _ := r.sh.match(b, 0); n != 12 {
			t.Fatalf("match %d", n)
		}
		ext := r.dev.alloc(t, 3)
		if err := r.sh.alloc("b", ext, 12, 0); err != nil {
			t.Fatal(err)
		}
		r.events = nil
		_, _, recv := r.run(nil, nil, map[string]int{}, nil)
		if fmt.Sprint(recv) != "[b]" {
			t.Fatalf("recv %v", recv)
		}
		if bad := r.w.BlockIDsWithLoadErrors(); fmt.Sprint(bad) != fmt.Sprint(ext[1:]) {
			t.Fatalf("load errors %v, want %v", bad, ext[1:])
		}
		if string(r.dev.blocks[ext[0]]) != string(blockPayload(seqs[0])) {
			t.Fatal("block 0 should have loaded")
		}
		if st := r.m.Stats(); st.Corrupt != 1 || st.OnboardedHost != 1 || st.HostBlocks != 2 {
			t.Fatalf("stats %+v", st)
		}
		if info, _ := r.c.Slot("b"); info.Current != 4 || info.LoadedHost != 4 {
			t.Fatalf("slot %+v", info)
		}
		if len(r.events) != 1 || r.events[0].Kind != kv.EventRemoved || r.events[0].Tier != kv.TierHost ||
			fmt.Sprint(r.events[0].Removed) != fmt.Sprint([]uint64{uint64(seqs[1])}) {
			t.Fatalf("events %+v", r.events)
		}
		// The next match stops where the corrupt block was.
		c := req("c", 100, 20)
		if n, _, _ := r.sh.match(c, 0); n != 4 {
			t.Fatalf("match after the drop %d, want 4", n)
		}
	})
}

// An engine may report a first computed position that leaves out what the
// connector loaded (TensorRT-LLM subtracts fresh connector matches): the
// loaded blocks still count as computed and are not offloaded again.
func TestLoadedTokensCountEvenIfTheEngineLeavesThemOut(t *testing.T) {
	forEachShape(t, func(t *testing.T, mk func(*Connector) shape) {
		r := newRig(t, mk, 32, 0)
		r.dev.release(r.prefill(req("a", 100, 13), nil, 16))
		b := req("b", 100, 19)
		seqs := seqsOf(b)
		if n, _, _ := r.sh.match(b, 0); n != 12 {
			t.Fatalf("match %d", n)
		}
		ext := r.dev.alloc(t, 3)
		if err := r.sh.alloc("b", ext, 12, 0); err != nil {
			t.Fatal(err)
		}
		r.run(nil, nil, map[string]int{}, nil)
		blocks := append(ext, r.dev.alloc(t, 2)...)
		md, _, _ := r.run([]stepReq{newReq(b, blocks, 0)}, nil, map[string]int{"b": 7},
			func() { r.computeBlocks(blocks, seqs, 3, 4) })
		if got := storedSeqs(md); fmt.Sprint(got) != fmt.Sprint(seqs[3:4]) {
			t.Fatalf("stored %v, want only block 3", got)
		}
		// A device hit that is not block aligned (partial reuse) matches nothing.
		if n, async, _ := r.sh.match(req("c", 100, 19), 6); n != 0 || async {
			t.Fatalf("unaligned device hit matched %d", n)
		}
	})
}

// TestPreemptedAfterOnboardingMatchesAgain: an engine that loads
// asynchronously may preempt a request after its load landed and before
// it ever ran; the engine freed its blocks, so the next allocation starts
// the slot's block list afresh and the load goes to the new blocks.
func TestPreemptedAfterOnboardingMatchesAgain(t *testing.T) {
	forEachShape(t, func(t *testing.T, mk func(*Connector) shape) {
		r := newRig(t, mk, 32, 0)
		a := req("a", 100, 13)
		r.dev.release(r.prefill(a, nil, 16))
		r.sh.finished("a")

		b := req("b", 100, 19)
		seqs := seqsOf(b)
		if n, _, err := r.sh.match(b, 0); n != 12 || err != nil {
			t.Fatalf("match: %d %v", n, err)
		}
		first := r.dev.alloc(t, 3)
		if err := r.sh.alloc("b", first, 12, 0); err != nil {
			t.Fatal(err)
		}
		r.run(nil, nil, map[string]int{}, nil) // the load lands
		r.dev.release(first)                   // preempted before it ran

		if n, _, err := r.sh.match(b, 0); n != 12 || err != nil {
			t.Fatalf("match after preemption: %d %v", n, err)
		}
		again := r.dev.alloc(t, 3)
		if err := r.sh.alloc("b", again, 12, 0); err != nil {
			t.Fatal(err)
		}
		if info, _ := r.c.Slot("b"); fmt.Sprint(info.DeviceBlocks) != fmt.Sprint(again) {
			t.Fatalf("slot blocks %v after reallocation, want %v", info.DeviceBlocks, again)
		}
		md, _, _ := r.run(nil, nil, map[string]int{}, nil)
		if len(md.Ops) != 1 || fmt.Sprint(md.Ops[0].Into) != fmt.Sprint(again) {
			t.Fatalf("metadata %+v", md)
		}
		for i, id := range again {
			if string(r.dev.blocks[id]) != string(blockPayload(seqs[i])) {
				t.Fatalf("device block %d does not hold block %d's KV", id, i)
			}
		}
	})
}
