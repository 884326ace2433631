package sim

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/kv"
)

// peerReader is what a fetcher needs from the block holder.
type peerReader interface {
	Pin([]kv.SeqHash) (int, func())
	ReadPayload(kv.SeqHash, int, []byte) (int, error)
}

// peerFetcher copies missing blocks from a peer, byte for byte, as the
// transfer client will. corrupt flips a byte of the given block index.
func peerFetcher(peer peerReader, cfg Config, corrupt int) Fetcher {
	return func(ctx context.Context, rq *engine.Request, m Missing, into Inserter) error {
		n, release := peer.Pin(m.Seq)
		defer release()
		ch := Chain{HasParent: m.HasParent, Parent: m.Parent, LoRA: rq.LoRA}
		for i := 0; i < n; i++ {
			b := BlockData{Local: m.Local[i], Seq: m.Seq[i],
				Tokens: rq.Tokens[(m.Start+i)*cfg.BlockSize : (m.Start+i+1)*cfg.BlockSize]}
			for l := 0; l < cfg.Layers; l++ {
				buf := make([]byte, cfg.PayloadSize)
				if _, err := peer.ReadPayload(m.Seq[i], l, buf); err != nil {
					return err
				}
				b.Sums = append(b.Sums, kv.Checksum(buf))
				if i == corrupt && l == 1 {
					buf[3] ^= 0x40
				}
				b.Layers = append(b.Layers, buf)
			}
			ch.Blocks = append(ch.Blocks, b)
		}
		_, err := into.Insert(ch)
		return err
	}
}

func seqOf(cfg Config, toks []kv.Token) []kv.SeqHash {
	return kv.SeqHashes(nil, kv.NewHasher(cfg.BlockSize, "", "").Local(toks))
}

func drain(c *Core) (steps []StepResult) {
	now := time.Unix(100, 0)
	for !c.Idle() {
		r := c.Step(now)
		steps = append(steps, *r)
		now = r.End
	}
	return steps
}

// fetchSource is a core whose fetched blocks are priced (1 MiB each at
// 1 GB/s) and a prompt of 10 full blocks + 2 (tokens step·i) for it.
func fetchSource(t *testing.T, step int) (Config, *Core, []kv.Token) {
	cfg := testConfig()
	cfg.TransferBytesPerBlock = 1 << 20
	cfg.TransferBandwidth = 1e9
	prompt := make([]kv.Token, 42)
	for i := range prompt {
		prompt[i] = kv.Token(step * i)
	}
	return cfg, mustCore(t, cfg), prompt
}

func TestFetchFromPeer(t *testing.T) {
	cfg, a, prompt := fetchSource(t, 3)
	sa, _ := a.Add(req("a", prompt, 5), time.Time{})
	drain(a)

	// The payload a holds is the derived one.
	seqs := seqOf(cfg, prompt)
	buf := make([]byte, cfg.PayloadSize)
	if _, err := a.ReadPayload(seqs[4], 1, buf); err != nil || string(buf) != string(kv.Payload(seqs[4], 1, cfg.PayloadSize)) {
		t.Fatalf("payload of block 4: %v", err)
	}
	if _, err := a.ReadPayload(12345, 0, buf); err == nil {
		t.Fatal("reading an uncached block succeeded")
	}
	if _, err := a.ReadPayload(seqs[0], cfg.Layers, buf); err == nil {
		t.Fatal("reading a layer out of range succeeded")
	}

	bcfg := cfg
	bcfg.Worker = kv.WorkerKey{Instance: 99}
	b := mustCore(t, bcfg)
	h := newHoldings(t, bcfg.Worker, cfg.BlockSize)
	b.SetEventSink(h.sink)
	// b computes the first 3 blocks itself: the fetch starts after them.
	b.Add(req("warm", prompt[:13], 1), time.Time{})
	drain(b)
	if b.CachedBlocks() != 3 {
		t.Fatalf("warm-up cached %d blocks", b.CachedBlocks())
	}
	var gotStart int
	inner := peerFetcher(a, cfg, -1)
	b.cfg.Fetcher = func(ctx context.Context, rq *engine.Request, m Missing, into Inserter) error {
		gotStart = m.Start
		if !m.HasParent || m.Parent != seqs[2] || len(m.Seq) != 7 {
			t.Errorf("missing %+v", m)
		}
		return inner(ctx, rq, m, into)
	}
	sb, err := b.Add(req("b", prompt, 5), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if gotStart != 3 || b.CachedBlocks() != 10 {
		t.Fatalf("fetch started at %d, %d blocks cached after it", gotStart, b.CachedBlocks())
	}
	steps := drain(b)
	m := sb.Metrics()
	if m.FetchedTokens != 7*cfg.BlockSize || m.CachedTokens != 40 {
		t.Fatalf("metrics %+v", m)
	}
	// The first pass computes only the 2 uncached tokens and pays for 7 blocks.
	first := steps[0]
	wantMS := PrefillMS(2) + DecodeMS(float64(42)/float64(cfg.Blocks*cfg.BlockSize)) + TransferMS(7<<20, 1e9)
	if first.PrefillTokens != 2 || first.TransferBytes != 7<<20 || first.Duration != msToDuration(wantMS) {
		t.Fatalf("first pass %+v, want duration %v", first, msToDuration(wantMS))
	}
	if !slices.Equal(sa.Output(), sb.Output()) {
		t.Fatal("fetched prefix changed the output")
	}
	if err := h.matches(b); err != nil {
		t.Fatal(err)
	}
	if ct := b.Counters(); ct.InsertedBlocks != 7 || ct.FetchedBlocks != 7 || ct.FetchCalls != 1 || ct.FetchErrors != 0 {
		t.Fatalf("counters %+v", ct)
	}
}

func TestInsertRejectsBadBlocks(t *testing.T) {
	cfg := testConfig()
	a := mustCore(t, cfg)
	prompt := make([]kv.Token, 24)
	for i := range prompt {
		prompt[i] = kv.Token(i + 1)
	}
	a.Add(req("a", prompt, 1), time.Time{})
	drain(a)
	seqs := seqOf(cfg, prompt)

	// A corrupt payload in block 3: blocks 0-2 land, the error names the byte.
	b := mustCore(t, cfg)
	h := newHoldings(t, cfg.Worker, cfg.BlockSize)
	b.SetEventSink(h.sink)
	f := peerFetcher(a, cfg, 3)
	var insErr error
	var n int
	err := f(context.Background(), req("b", prompt, 1), Missing{Local: kv.NewHasher(4, "", "").Local(prompt), Seq: seqs},
		inserterFunc(func(ch Chain) (int, error) { n, insErr = b.Insert(ch); return n, insErr }))
	if err == nil || n != 3 || !strings.Contains(err.Error(), "block 3 of 6") || b.Lookup(seqs) != 3 {
		t.Fatalf("corrupt block: n %d, err %v, cached %d", n, err, b.Lookup(seqs))
	}
	if err := h.matches(b); err != nil {
		t.Fatal(err)
	}

	good := func(i int) BlockData {
		bd := BlockData{Local: kv.NewHasher(4, "", "").Local(prompt)[i], Seq: seqs[i]}
		for l := 0; l < cfg.Layers; l++ {
			p := kv.Payload(seqs[i], l, cfg.PayloadSize)
			bd.Layers, bd.Sums = append(bd.Layers, p), append(bd.Sums, kv.Checksum(p))
		}
		return bd
	}
	c := mustCore(t, cfg)
	cases := []struct {
		name string
		ch   Chain
	}{
		{"parent not cached", Chain{HasParent: true, Parent: seqs[0], Blocks: []BlockData{good(1)}}},
		{"does not chain", Chain{Blocks: []BlockData{good(1)}}},
		{"missing layer", Chain{Blocks: []BlockData{func() BlockData { b := good(0); b.Layers = b.Layers[:1]; return b }()}}},
		{"short payload", Chain{Blocks: []BlockData{func() BlockData { b := good(0); b.Layers[0] = b.Layers[0][:5]; return b }()}}},
		{"wrong tokens", Chain{Blocks: []BlockData{func() BlockData { b := good(0); b.Tokens = []kv.Token{1}; return b }()}}},
	}
	for _, tc := range cases {
		if n, err := c.Insert(tc.ch); err == nil || n != 0 {
			t.Errorf("%s: n %d err %v", tc.name, n, err)
		}
	}
	if c.CachedBlocks() != 0 {
		t.Fatal("rejected blocks were cached")
	}
	// A good chain lands; inserting it again is a no-op.
	ch := Chain{Blocks: []BlockData{good(0), good(1)}}
	if n, err := c.Insert(ch); n != 2 || err != nil {
		t.Fatalf("good chain: %d %v", n, err)
	}
	if n, err := c.Insert(ch); n != 2 || err != nil || c.Counters().InsertedBlocks != 2 {
		t.Fatalf("repeat insert: %d %v %+v", n, err, c.Counters())
	}

	// Full pool: every block pinned → ErrNoSpace, and nothing changes.
	small := testConfig()
	small.Blocks = 4
	d := mustCore(t, small)
	if n, err := d.Insert(Chain{Blocks: []BlockData{good(0), good(1), good(2), good(3)}}); n != 4 || err != nil {
		t.Fatalf("filling the pool: %d %v", n, err)
	}
	if n, rel := d.Pin(seqs); n != 4 {
		t.Fatalf("pinned %d", n)
	} else {
		defer rel()
	}
	if n, err := d.Insert(Chain{HasParent: true, Parent: seqs[3], Blocks: []BlockData{good(4)}}); n != 0 || !errors.Is(err, ErrNoSpace) {
		t.Fatalf("insert into a full pool: %d %v", n, err)
	}
	checkPool(t, d, map[int32]int{0: 1, 1: 1, 2: 1, 3: 1})
}

type inserterFunc func(Chain) (int, error)

func (f inserterFunc) Insert(ch Chain) (int, error) { return f(ch) }

// TestPinBlocksEviction: a pinned idle block survives pressure that evicts
// everything else.
func TestPinBlocksEviction(t *testing.T) {
	cfg := testConfig()
	cfg.Blocks = 8
	cfg.Watermark = 0
	c := mustCore(t, cfg)
	p1 := []kv.Token{1, 2, 3, 4, 5, 6, 7, 8, 9}
	c.Add(req("p1", p1, 1), time.Time{})
	drain(c)
	s1 := seqOf(cfg, p1)
	n, release := c.Pin(s1)
	if n != 2 {
		t.Fatalf("pinned %d", n)
	}
	c.Add(req("big", make([]kv.Token, 20), 4), time.Time{}) // needs 6 blocks: all but the pinned two
	drain(c)
	if c.Lookup(s1) != 2 {
		t.Fatal("a pinned block was evicted")
	}
	release()
	c.Add(req("big2", append(make([]kv.Token, 27), 5), 4), time.Time{}) // needs 8
	drain(c)
	if c.Lookup(s1) != 0 {
		t.Fatal("released blocks were not evictable")
	}
	checkPool(t, c, nil)
}

// TestEngineFetcher: the Engine calls its Fetcher on the request's
// goroutine, against a peer Engine.
func TestEngineFetcher(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SpeedupRatio = 0
	a := mustEngine(t, cfg)
	prompt := make([]kv.Token, 700)
	for i := range prompt {
		prompt[i] = kv.Token(i * 13 % 9999)
	}
	ch, _ := a.Generate(context.Background(), &engine.Request{ID: "a", Tokens: prompt, Sampling: kv.Sampling{MaxTokens: 3}})
	ta, _ := collect(t, ch)
	bcfg := cfg
	bcfg.Fetcher = peerFetcher(a, cfg, -1)
	b := mustEngine(t, bcfg)
	ch, _ = b.Generate(context.Background(), &engine.Request{ID: "b", Tokens: prompt, Sampling: kv.Sampling{MaxTokens: 3}})
	tb, last := collect(t, ch)
	if !slices.Equal(ta, tb) || last.Usage.CachedTokens != 640 {
		t.Fatalf("b: %v vs %v, usage %+v", tb, ta, last.Usage)
	}
	if ct := b.Counters(); ct.FetchedBlocks != 10 || ct.InsertedBlocks != 10 || ct.PrefillTokens != 60 {
		t.Fatalf("counters %+v", ct)
	}
}

// A prepaid prompt's fetched blocks are cached as any fetch's but cost its
// first pass nothing (a P/D handoff whose pull the caller models); the
// same prompt not prepaid pays for them.
func TestFetchPrepaid(t *testing.T) {
	cfg, a, prompt := fetchSource(t, 5)
	a.Add(req("a", prompt, 1), time.Time{})
	drain(a)
	local := kv.NewHasher(cfg.BlockSize, "", "").Local(prompt)
	for _, prepaid := range []bool{false, true} {
		bcfg := cfg
		bcfg.Fetcher = peerFetcher(a, cfg, -1)
		b := mustCore(t, bcfg)
		s, err := b.AddPrompt(req("b", prompt, 1), Prompt{Len: len(prompt), Local: local, Tail: prompt[40:], Prepaid: prepaid}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		first := drain(b)[0]
		want := int64(10 << 20)
		if prepaid {
			want = 0
		}
		if first.PrefillTokens != 2 || first.TransferBytes != want || s.Metrics().FetchedTokens != 40 {
			t.Fatalf("prepaid %v: first pass %+v, fetched %d tokens; want %d transfer bytes", prepaid, first, s.Metrics().FetchedTokens, want)
		}
	}
}
