package sim

import (
	"fmt"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/kv"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// checkPool verifies the pool's internal invariants and that the block
// references equal what live requests (and pins) hold.
func checkPool(t *testing.T, c *Core, extraRefs map[int32]int) {
	t.Helper()
	p := &c.pool
	n := len(p.blocks)
	refs := map[int32]int{}
	active := c.running
	if c.kb != nil {
		active = append(slices.Clone(active), c.kb.loadq...)
	}
	for _, s := range active {
		for _, id := range s.table {
			refs[id]++
		}
	}
	for i := 0; i < c.waiting.len(); i++ {
		if s := c.waiting.at(i); len(s.table) != 0 || s.computed != 0 {
			t.Fatalf("waiting request %s holds %d blocks, %d computed", s.ID(), len(s.table), s.computed)
		}
	}
	for id, k := range extraRefs {
		refs[id] += k
	}
	used, registered := 0, 0
	for i := range p.blocks {
		b := &p.blocks[i]
		if int(b.ref) != refs[int32(i)] {
			t.Fatalf("block %d: ref %d, requests hold %d", i, b.ref, refs[int32(i)])
		}
		if b.ref > 0 {
			used++
		}
		if b.flags&flagRegistered != 0 {
			registered++
			if id, ok := p.byHash.Get(b.seq); !ok || id != int32(i) {
				t.Fatalf("registered block %d (%016x) not indexed", i, b.seq)
			}
		}
	}
	if used != p.used || used > n {
		t.Fatalf("used %d, counted %d, capacity %d", p.used, used, n)
	}
	if registered != p.byHash.Len() {
		t.Fatalf("%d registered blocks, %d hashes", registered, p.byHash.Len())
	}
	// LRU: exactly the idle registered blocks; free: exactly the idle unregistered ones.
	lru := 0
	for id, prev := p.lruHead, int32(-1); id >= 0; id = p.blocks[id].next {
		b := &p.blocks[id]
		if b.ref != 0 || b.flags&flagRegistered == 0 || b.prev != prev {
			t.Fatalf("LRU holds block %d with ref %d flags %b", id, b.ref, b.flags)
		}
		prev = id
		lru++
	}
	if lru != p.lruLen {
		t.Fatalf("LRU walk %d, length %d", lru, p.lruLen)
	}
	for _, id := range p.free {
		if b := &p.blocks[id]; b.ref != 0 || b.flags != 0 {
			t.Fatalf("free block %d has ref %d flags %b", id, b.ref, b.flags)
		}
	}
	if len(p.free)+lru+used != n {
		t.Fatalf("free %d + lru %d + used %d != %d", len(p.free), lru, used, n)
	}
	// Every running request's table covers its computed tokens and its
	// leading registered blocks carry its hashes.
	for _, s := range c.running {
		if len(s.table) != kv.BlocksNeeded(s.computed, c.bs) {
			t.Fatalf("%s: %d blocks for %d computed tokens", s.ID(), len(s.table), s.computed)
		}
		for b := 0; b < s.nReg; b++ {
			if got := p.blocks[s.table[b]].seq; got != s.seqh[b] {
				t.Fatalf("%s block %d: pool hash %016x, request hash %016x", s.ID(), b, got, s.seqh[b])
			}
		}
	}
}

// refOutput recomputes a request's deterministic output from scratch: each
// token is NextToken over the hashes of the whole context before it.
func refOutput(prompt []kv.Token, seed uint64, lora, salt string, n, bs int, vocab uint32, stops []kv.Token) []kv.Token {
	ctx := append([]kv.Token(nil), prompt...)
	h := kv.NewHasher(bs, lora, salt)
	var out []kv.Token
	for len(out) < n {
		_, seqs := h.Blocks(ctx)
		var cs kv.SeqHash
		if len(seqs) > 0 {
			cs = seqs[len(seqs)-1]
		}
		tail := uint64(tailInit)
		for _, t := range ctx[len(seqs)*bs:] {
			tail = rollTail(tail, t)
		}
		tok := NextToken(seed, cs, tail, vocab)
		out = append(out, tok)
		ctx = append(ctx, tok)
		stop := false
		for _, s := range stops {
			stop = stop || s == tok
		}
		if stop {
			break
		}
	}
	return out
}

// holdings replays KV events into a set of held blocks, failing on any
// event the holdings could not have produced.
type holdings struct {
	t      *testing.T
	worker kv.WorkerKey
	bs     int
	nextID uint64
	held   map[kv.EngineHash]kv.LocalHash // the sim's engine hash is its sequence hash
	events int
}

func newHoldings(t *testing.T, w kv.WorkerKey, bs int) *holdings {
	return &holdings{t: t, worker: w, bs: bs, nextID: 1, held: map[kv.EngineHash]kv.LocalHash{}}
}

func (h *holdings) sink(batch []kv.Event) {
	h.t.Helper()
	if len(batch) == 0 {
		h.t.Fatal("empty event batch")
	}
	for _, e := range batch {
		h.events++
		if e.ID != h.nextID {
			h.t.Fatalf("event id %d, want %d", e.ID, h.nextID)
		}
		h.nextID++
		if e.Worker != h.worker || e.Tier != kv.TierDevice {
			h.t.Fatalf("event from %v tier %v", e.Worker, e.Tier)
		}
		switch e.Kind {
		case kv.EventStored:
			if len(e.Blocks) == 0 {
				h.t.Fatal("stored event without blocks")
			}
			if e.HasParent {
				if _, ok := h.held[e.Parent]; !ok {
					h.t.Fatalf("stored event %d: parent %016x not held", e.ID, e.Parent)
				}
			}
			if e.Tokens != nil && len(e.Tokens) != len(e.Blocks)*h.bs {
				h.t.Fatalf("stored event %d: %d tokens for %d blocks", e.ID, len(e.Tokens), len(e.Blocks))
			}
			prev, hasPrev := e.Parent, e.HasParent
			for i, b := range e.Blocks {
				if _, ok := h.held[b.EngineHash]; ok {
					h.t.Fatalf("stored event %d: block %016x already held", e.ID, b.EngineHash)
				}
				want := kv.SeqHash(b.LocalHash)
				if hasPrev {
					want = kv.ChainHash(kv.SeqHash(prev), b.LocalHash)
				}
				if b.EngineHash != kv.EngineHash(want) {
					h.t.Fatalf("stored event %d block %d: engine hash does not chain", e.ID, i)
				}
				if e.Tokens != nil {
					if lh := kv.HashTokens(e.Tokens[i*h.bs:(i+1)*h.bs], kv.Seed(e.LoRA, e.Salt)); lh != b.LocalHash {
						h.t.Fatalf("stored event %d block %d: tokens hash to %016x, local %016x", e.ID, i, lh, b.LocalHash)
					}
				}
				h.held[b.EngineHash] = b.LocalHash
				prev, hasPrev = b.EngineHash, true
			}
		case kv.EventRemoved:
			for _, r := range e.Removed {
				if _, ok := h.held[r]; !ok {
					h.t.Fatalf("removed event %d: block %016x not held", e.ID, r)
				}
				delete(h.held, r)
			}
		default:
			h.t.Fatalf("unexpected event kind %v", e.Kind)
		}
	}
}

// matches reports whether the replayed holdings equal the pool's blocks.
func (h *holdings) matches(c *Core) error {
	cached := c.AppendCached(nil)
	if len(cached) != len(h.held) {
		return fmt.Errorf("pool holds %d blocks, events say %d", len(cached), len(h.held))
	}
	for _, b := range cached {
		if l, ok := h.held[kv.EngineHash(b.Seq)]; !ok || l != b.Local {
			return fmt.Errorf("pool block %016x missing from the replay", b.Seq)
		}
	}
	return nil
}

func testConfig() Config {
	cfg := DefaultConfig()
	cfg.BlockSize = 4
	cfg.Blocks = 64
	cfg.MaxBatchedTokens = 32
	cfg.MaxSeqs = 4
	cfg.VocabSize = 1000
	cfg.Worker = kv.WorkerKey{Instance: 7, DPRank: 1}
	return cfg
}

func mustCore(t testing.TB, cfg Config) *Core {
	t.Helper()
	c, err := NewCore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func req(id string, toks []kv.Token, maxTokens int) *engine.Request {
	return &engine.Request{ID: id, Tokens: toks, Sampling: kv.Sampling{MaxTokens: maxTokens, Seed: 1}}
}
