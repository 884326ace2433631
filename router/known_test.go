package router

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

// The hashes a request brings for its first blocks (Request.Known, a
// conversation's turn before) give the same decision as hashing the whole
// prompt: the same local and sequence hashes as a fresh kv.LocalHashes and
// kv.SeqHashes under the request's seed and the pool's block size, the
// same worker and overlap. Hashes made with another seed (LoRA, salt) or
// block size are not used.
func FuzzKnownHashes(f *testing.F) {
	f.Add(uint64(1), uint16(640), uint16(320), uint8(0), uint8(0))
	f.Add(uint64(2), uint16(700), uint16(700), uint8(0), uint8(0))
	f.Add(uint64(3), uint16(640), uint16(639), uint8(1), uint8(0))
	f.Add(uint64(4), uint16(640), uint16(480), uint8(2), uint8(0))
	f.Add(uint64(5), uint16(640), uint16(480), uint8(0), uint8(1))
	f.Add(uint64(6), uint16(15), uint16(15), uint8(0), uint8(0))
	f.Add(uint64(7), uint16(100), uint16(900), uint8(0), uint8(0))
	f.Add(uint64(8), uint16(110), uint16(900), uint8(0), uint8(0)) // known past the prompt's last full block
	f.Fuzz(func(t *testing.T, seed uint64, n, known uint16, otherSeed, otherBS uint8) {
		rng := rand.New(rand.NewPCG(seed, 9))
		n %= 1200
		toks := make([]kv.Token, n)
		for i := range toks {
			toks[i] = kv.Token(rng.IntN(50)) // few distinct blocks' worth of ids: collisions of content, not of hashes
		}
		const lora, salt = "adapter", "tenant"
		kseed, kbs := kv.Seed(lora, salt), testBS
		switch otherSeed % 3 {
		case 1:
			kseed = kv.Seed(lora, "another tenant")
		case 2:
			kseed = kv.Seed("", salt)
		}
		if otherBS%2 == 1 {
			kbs = 2 * testBS
		}
		// Known is made for an earlier prompt that toks start with (its
		// first known tokens, then its own), as the frontend's prefix cache
		// makes a next turn's tokens.
		earlier := append(slices.Clone(toks[:min(int(known), len(toks))]), 7, 7, 7)
		kl := kv.LocalHashes(nil, earlier, kbs, kseed)
		h := &kv.BlockHashes{Seed: kseed, BlockSize: kbs, Local: kl, Seq: kv.SeqHashes(nil, kl)}
		h = h.Prefix(int(known))
		var saved []kv.LocalHash
		if h != nil {
			saved = slices.Clone(h.Local)
		}

		want := kv.LocalHashes(nil, toks, testBS, kv.Seed(lora, salt))
		wantSeq := kv.SeqHashes(nil, want)
		decide := func(known *kv.BlockHashes) *Decision {
			ix := newFakeIndex()
			ix.store(key(2), kv.TierDevice, wantSeq[:len(wantSeq)/2])
			ix.store(key(3), kv.TierHost, wantSeq)
			r := newRouter(t, Config{Matcher: ix, Rand: rand.New(rand.NewPCG(seed, 1))})
			for w := range uint64(3) {
				info := winfo(w + 1)
				info.LoRAs = []string{lora}
				if err := r.AddWorker(info); err != nil {
					t.Fatal(err)
				}
			}
			d, err := r.Route(context.Background(), Request{Model: "m", Tokens: toks, LoRA: lora, Salt: salt, Known: known})
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
		whole, fast := decide(nil), decide(h)
		if !slices.Equal(fast.Local, want) || !slices.Equal(fast.Seq, wantSeq) {
			t.Fatalf("n=%d known=%d seed#%d bs=%d: hashes differ from a fresh hashing", n, known, otherSeed%3, kbs)
		}
		if fast.Worker != whole.Worker || fast.Overlap != whole.Overlap || fast.CachedTokens != whole.CachedTokens {
			t.Fatalf("routed to %v %v, the whole path to %v %v", fast.Worker, fast.Overlap, whole.Worker, whole.Overlap)
		}
		if h != nil && (!slices.Equal(h.Local, saved[:len(h.Local)]) || len(fast.Local) > 0 && len(h.Local) > 0 && &fast.Local[0] == &h.Local[0]) {
			t.Fatal("routing wrote to or kept the known hashes' arrays")
		}
	})
}
