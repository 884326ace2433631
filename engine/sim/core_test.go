package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/kv"
)

// TestSchedulerInvariantsRandomLoad drives cores with random requests
// (shared prefixes, LoRAs, stop tokens, aborts, pins, a tight pool that
// forces preemption) and checks after every pass: the budget and sequence
// limit hold, blocks in use stay within capacity, the pool's references are
// exactly what requests hold, outputs equal the from-scratch reference, and
// replaying the KV events reproduces exactly the cached blocks.
func TestSchedulerInvariantsRandomLoad(t *testing.T) {
	for seed := uint64(1); seed <= 12; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { randomLoad(t, seed) })
	}
}

func randomLoad(t *testing.T, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 99))
	cfg := testConfig()
	cfg.Blocks = 24 + r.IntN(64)
	cfg.MaxBatchedTokens = 8 + r.IntN(40)
	cfg.MaxSeqs = 1 + r.IntN(6)
	cfg.VocabSize = 40 + r.IntN(200) // small so stop tokens do occur
	c := mustCore(t, cfg)
	h := newHoldings(t, cfg.Worker, cfg.BlockSize)
	c.SetEventSink(h.sink)

	prefixes := make([][]kv.Token, 4)
	for i := range prefixes {
		prefixes[i] = make([]kv.Token, 4*(1+r.IntN(5))+r.IntN(4))
		for j := range prefixes[i] {
			prefixes[i][j] = kv.Token(r.IntN(cfg.VocabSize))
		}
	}
	loras := []string{"", "", "adapter-a"}
	type live struct {
		s    *Seq
		got  []kv.Token
		done bool
	}
	var all []*live
	bySeq := map[*Seq]*live{}
	pins := map[int32]int{}
	var releases []func()
	var pinIDs [][]int32
	now := time.Unix(0, 0)
	var repeatHits, repeats int

	for step := 0; step < 600; step++ {
		// Arrivals, in bursts with quiet phases that let the core drain.
		arrivals := 0
		if (step/50)%3 == 0 {
			arrivals = r.IntN(3)
		}
		for k := arrivals; k > 0; k-- {
			var toks []kv.Token
			if r.IntN(4) > 0 {
				toks = append(toks, prefixes[r.IntN(len(prefixes))]...)
			}
			for j := r.IntN(20); j >= 0; j-- {
				toks = append(toks, kv.Token(r.IntN(cfg.VocabSize)))
			}
			max := 1 + r.IntN(24)
			if kv.BlocksNeeded(len(toks)+max, cfg.BlockSize) > cfg.Blocks {
				continue
			}
			rq := &engine.Request{ID: fmt.Sprint("r", len(all)), Tokens: toks, Sampling: kv.Sampling{MaxTokens: max, Seed: uint64(r.IntN(3))}, LoRA: loras[r.IntN(len(loras))]}
			if r.IntN(3) == 0 {
				rq.StopTokens = []kv.Token{kv.Token(r.IntN(cfg.VocabSize)), kv.Token(r.IntN(cfg.VocabSize))}
			}
			s, err := c.Add(rq, now)
			if err != nil {
				t.Fatal(err)
			}
			l := &live{s: s}
			all = append(all, l)
			bySeq[s] = l
		}
		// Occasional aborts, pins and pin releases.
		if len(all) > 0 && r.IntN(10) == 0 {
			l := all[r.IntN(len(all))]
			if c.Abort(l.s, now) != !l.done {
				t.Fatalf("abort of %s (done=%v) misreported", l.s.ID(), l.done)
			}
			l.done = true
		}
		if len(all) > 0 && r.IntN(8) == 0 {
			l := all[r.IntN(len(all))]
			n, rel := c.Pin(l.s.seqh)
			ids := make([]int32, n)
			for i := 0; i < n; i++ {
				ids[i], _ = c.pool.byHash.Get(l.s.seqh[i])
				pins[ids[i]]++
			}
			releases, pinIDs = append(releases, rel), append(pinIDs, ids)
		}
		if len(releases) > 0 && r.IntN(4) == 0 {
			i := r.IntN(len(releases))
			releases[i]()
			releases[i]() // idempotent
			for _, id := range pinIDs[i] {
				pins[id]--
			}
			releases = slices.Delete(releases, i, i+1)
			pinIDs = slices.Delete(pinIDs, i, i+1)
		}

		res := c.Step(now)
		if res.BatchedTokens > cfg.MaxBatchedTokens || res.Seqs > cfg.MaxSeqs || len(c.running) > cfg.MaxSeqs {
			t.Fatalf("step %d: %d tokens (budget %d), %d seqs (max %d)", step, res.BatchedTokens, cfg.MaxBatchedTokens, res.Seqs, cfg.MaxSeqs)
		}
		if c.pool.used > cfg.Blocks {
			t.Fatalf("step %d: %d blocks in use of %d", step, c.pool.used, cfg.Blocks)
		}
		if res.End.Sub(res.Start) != res.Duration || (res.Seqs > 0) != (res.Duration > 0) {
			t.Fatalf("step %d: duration %v for %d seqs", step, res.Duration, res.Seqs)
		}
		seen := map[*Seq]bool{}
		firsts, finished := 0, 0
		for _, o := range res.Outputs {
			if o.First {
				firsts++
			}
			if o.Finish != kv.FinishNone {
				finished++
			}
		}
		if res.FirstTokens != firsts || res.Finished != finished {
			t.Fatalf("step %d: FirstTokens %d, Finished %d; outputs have %d and %d", step, res.FirstTokens, res.Finished, firsts, finished)
		}
		for _, o := range res.Outputs {
			if seen[o.Seq] {
				t.Fatalf("step %d: two tokens for %s", step, o.Seq.ID())
			}
			seen[o.Seq] = true
			l := bySeq[o.Seq]
			if l.done {
				t.Fatalf("step %d: token for finished %s", step, o.Seq.ID())
			}
			if o.First != (len(l.got) == 0) {
				t.Fatalf("step %d: First=%v after %d tokens", step, o.First, len(l.got))
			}
			l.got = append(l.got, o.Token)
			if o.Finish != kv.FinishNone {
				l.done = true
				m := o.Seq.Metrics()
				if m.Finish != o.Finish || !m.Finished.Equal(res.End) || m.FirstToken.IsZero() {
					t.Fatalf("%s: metrics %+v", o.Seq.ID(), m)
				}
			}
		}
		checkPool(t, c, pins)
		if err := h.matches(c); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		now = res.End.Add(time.Millisecond)
		// Repeat a finished prompt: with nothing evicting in between, it hits.
		if len(all) > 0 && r.IntN(3) == 0 {
			l := all[r.IntN(len(all))]
			if l.done && l.s.m.Finish != kv.FinishCancelled && c.waiting.len() == 0 && len(c.running) == 0 {
				rq := *l.s.req
				rq.ID += "-again"
				want := c.Lookup(l.s.seqh[:min(len(l.s.seqh), (len(rq.Tokens)-1)/cfg.BlockSize)])
				s, err := c.Add(&rq, now)
				if err != nil {
					t.Fatal(err)
				}
				res := c.Step(now)
				if s.m.CachedTokens != want*cfg.BlockSize {
					t.Fatalf("repeat of %s: %d cached tokens, %d blocks were cached", rq.ID, s.m.CachedTokens, want)
				}
				repeats++
				if want > 0 {
					repeatHits++
				}
				nl := &live{s: s}
				all, bySeq[s] = append(all, nl), nl
				for _, o := range res.Outputs {
					bySeq[o.Seq].got = append(bySeq[o.Seq].got, o.Token)
					if o.Finish != kv.FinishNone {
						bySeq[o.Seq].done = true
					}
				}
				now = res.End
			}
		}
	}
	// Drain.
	for _, rel := range releases {
		rel()
	}
	clear(pins)
	for i := 0; !c.Idle(); i++ {
		if i > 100000 {
			t.Fatal("core never drained")
		}
		res := c.Step(now)
		for _, o := range res.Outputs {
			bySeq[o.Seq].got = append(bySeq[o.Seq].got, o.Token)
		}
		now = res.End
	}
	checkPool(t, c, nil)
	if c.pool.used != 0 {
		t.Fatalf("%d blocks still used when idle", c.pool.used)
	}
	if err := h.matches(c); err != nil {
		t.Fatal(err)
	}
	// Repeat the most recently finished prompts on the idle core: each hits
	// exactly the blocks the cache still holds, and the latest hits.
	for i, k := len(all)-1, 0; i >= 0 && k < 5; i-- {
		l := all[i]
		if l.s.m.Finish == kv.FinishCancelled || len(l.s.prompt) <= cfg.BlockSize {
			continue
		}
		k++
		rq := *l.s.req
		rq.ID += "-repeat"
		want := c.Lookup(l.s.seqh[:min(len(l.s.seqh), (len(rq.Tokens)-1)/cfg.BlockSize)])
		s, err := c.Add(&rq, now)
		if err != nil {
			t.Fatal(err)
		}
		c.Step(now)
		if s.m.CachedTokens != want*cfg.BlockSize {
			t.Fatalf("repeat of %s: %d cached tokens, %d blocks were cached", rq.ID, s.m.CachedTokens, want)
		}
		repeats++
		if want > 0 {
			repeatHits++
		}
		c.Abort(s, now)
	}
	var finished, stopped int
	for _, l := range all {
		s := l.s
		if s.m.Finish == kv.FinishCancelled {
			continue
		}
		finished++
		rq := s.req
		want := refOutput(rq.Tokens, rq.Seed, rq.LoRA, rq.CacheSalt, rq.MaxTokens, cfg.BlockSize, uint32(cfg.VocabSize), rq.StopTokens)
		if !slices.Equal(l.got, want) || !slices.Equal(s.Output(), want) {
			t.Fatalf("%s: got %v, reference %v", s.ID(), l.got, want)
		}
		if s.m.Finish == kv.FinishStop {
			stopped++
			if !slices.Contains(rq.StopTokens, want[len(want)-1]) {
				t.Fatalf("%s: stop without a stop token", s.ID())
			}
		} else if s.m.Finish != kv.FinishLength || len(l.got) != rq.MaxTokens {
			t.Fatalf("%s: finish %q with %d of %d tokens", s.ID(), s.m.Finish, len(l.got), rq.MaxTokens)
		}
		if u := s.Usage(); u.CompletionTokens != len(want) || u.PromptTokens != len(rq.Tokens) {
			t.Fatalf("%s: usage %+v", s.ID(), u)
		}
	}
	ct := c.Counters()
	t.Logf("blocks %d budget %d seqs %d: %d requests (%d finished, %d by stop), %d preemptions, %d evictions, %d events, repeats %d/%d hit",
		cfg.Blocks, cfg.MaxBatchedTokens, cfg.MaxSeqs, len(all), finished, stopped, ct.Preemptions, ct.EvictedBlocks, h.events, repeatHits, repeats)
	if finished == 0 || h.events == 0 || repeatHits == 0 || ct.CachedTokens == 0 {
		t.Fatal("the random load exercised nothing (or no repeated prompt hit the cache)")
	}
}

// TestPreemptionRecomputes squeezes two long requests into a pool that holds
// only one of them: the later one is preempted (LIFO), recomputed, and both
// still produce the reference output.
func TestPreemptionRecomputes(t *testing.T) {
	cfg := testConfig()
	cfg.Blocks = 12
	cfg.Watermark = 0
	cfg.MaxBatchedTokens = 64
	c := mustCore(t, cfg)
	h := newHoldings(t, cfg.Worker, cfg.BlockSize)
	c.SetEventSink(h.sink)
	mk := func(off int) []kv.Token {
		toks := make([]kv.Token, 10)
		for i := range toks {
			toks[i] = kv.Token(off + i)
		}
		return toks
	}
	a, _ := c.Add(req("a", mk(0), 30), time.Time{})
	b, _ := c.Add(req("b", mk(100), 30), time.Time{})
	var now time.Time
	preempted := 0
	for !c.Idle() {
		r := c.Step(now)
		preempted += r.Preempted
		checkPool(t, c, nil)
		now = r.End
	}
	if preempted == 0 || b.m.Preemptions == 0 || a.m.Preemptions != 0 {
		t.Fatalf("want the later request preempted: a %d, b %d, step total %d", a.m.Preemptions, b.m.Preemptions, preempted)
	}
	for _, s := range []*Seq{a, b} {
		want := refOutput(s.req.Tokens, 1, "", "", 30, cfg.BlockSize, uint32(cfg.VocabSize), nil)
		if !slices.Equal(s.Output(), want) {
			t.Fatalf("%s after preemption: %v, want %v", s.ID(), s.Output(), want)
		}
	}
	if err := h.matches(c); err != nil {
		t.Fatal(err)
	}
}

// TestDecodeBlocksAreCached checks that blocks completed by generated tokens
// are cached (and announced) like prompt blocks, so a follow-up turn whose
// prompt is prompt+answer reuses them.
func TestDecodeBlocksAreCached(t *testing.T) {
	cfg := testConfig()
	c := mustCore(t, cfg)
	h := newHoldings(t, cfg.Worker, cfg.BlockSize)
	c.SetEventSink(h.sink)
	prompt := []kv.Token{1, 2, 3, 4, 5, 6}
	s, _ := c.Add(req("turn1", prompt, 11), time.Time{})
	for !c.Idle() {
		c.Step(time.Time{})
	}
	// 6 + 11 = 17 tokens; the last one is never computed, so 16 tokens = 4 blocks.
	if got := c.CachedBlocks(); got != 4 {
		t.Fatalf("%d blocks cached after a 17-token sequence, want 4", got)
	}
	if err := h.matches(c); err != nil {
		t.Fatal(err)
	}
	next := append(append(append([]kv.Token(nil), prompt...), s.Output()...), 77, 78)
	s2, _ := c.Add(req("turn2", next, 1), time.Time{})
	c.Step(time.Time{})
	if s2.m.CachedTokens != 16 {
		t.Fatalf("second turn reused %d tokens, want 16", s2.m.CachedTokens)
	}
	// And the continuation property: prompt+answer[:k] continues the answer.
	s3, _ := c.Add(req("migrated", append(append([]kv.Token(nil), prompt...), s.Output()[:5]...), 6), time.Time{})
	for !c.Idle() {
		c.Step(time.Time{})
	}
	if !slices.Equal(s3.Output(), s.Output()[5:]) {
		t.Fatalf("migrated continuation %v, want %v", s3.Output(), s.Output()[5:])
	}
}

func TestSaltAndLoRAIsolateCache(t *testing.T) {
	c := mustCore(t, testConfig())
	prompt := []kv.Token{1, 2, 3, 4, 5, 6, 7, 8, 9}
	run := func(id, lora, salt string) *Seq {
		rq := req(id, prompt, 1)
		rq.LoRA, rq.CacheSalt = lora, salt
		s, err := c.Add(rq, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		for !c.Idle() {
			c.Step(time.Time{})
		}
		return s
	}
	run("base", "", "")
	if s := run("base-again", "", ""); s.m.CachedTokens != 8 {
		t.Fatalf("repeat hit %d tokens, want 8", s.m.CachedTokens)
	}
	if s := run("salted", "", "tenant"); s.m.CachedTokens != 0 {
		t.Fatalf("a salted request hit %d tokens of unsalted cache", s.m.CachedTokens)
	}
	if s := run("lora", "a", ""); s.m.CachedTokens != 0 {
		t.Fatalf("a LoRA request hit %d tokens of base cache", s.m.CachedTokens)
	}
}

// TestStoredEventsCarrySalt: every Stored event of a salted request, the
// prompt's and the continuations decode adds, names the request's LoRA and
// salt, and its tokens hash to its local hashes with both (the holdings
// checker rehashes every event).
func TestStoredEventsCarrySalt(t *testing.T) {
	cfg := testConfig()
	c := mustCore(t, cfg)
	h := newHoldings(t, cfg.Worker, cfg.BlockSize)
	var stored []kv.Event
	c.SetEventSink(func(b []kv.Event) {
		h.sink(b)
		for _, e := range b {
			if e.Kind == kv.EventStored {
				stored = append(stored, e)
			}
		}
	})
	prompt := []kv.Token{1, 2, 3, 4, 5, 6, 7, 8, 9}
	for _, id := range []struct{ lora, salt string }{{"", "tenant"}, {"a", "tenant"}, {"", ""}} {
		stored = stored[:0]
		rq := req(id.lora+"/"+id.salt, prompt, 8) // decode fills blocks 3 and 4
		rq.LoRA, rq.CacheSalt = id.lora, id.salt
		if _, err := c.Add(rq, time.Time{}); err != nil {
			t.Fatal(err)
		}
		for !c.Idle() {
			c.Step(time.Time{})
		}
		blocks, continuations := 0, 0
		for _, e := range stored {
			if e.LoRA != id.lora || e.Salt != id.salt {
				t.Fatalf("%+v: event %d names LoRA %q salt %q", id, e.ID, e.LoRA, e.Salt)
			}
			blocks += len(e.Blocks)
			if e.HasParent {
				continuations++
			}
		}
		if blocks != 4 || continuations == 0 {
			t.Fatalf("%+v: %d blocks in %d events, %d continuations", id, blocks, len(stored), continuations)
		}
	}
}

func TestAddValidates(t *testing.T) {
	c := mustCore(t, testConfig())
	cases := []*engine.Request{
		nil,
		{ID: "empty", Sampling: kv.Sampling{MaxTokens: 1}},
		{ID: "zero", Tokens: []kv.Token{1}, Sampling: kv.Sampling{MaxTokens: 0}},
		{ID: "huge", Tokens: make([]kv.Token, 250), Sampling: kv.Sampling{MaxTokens: 10}}, // 260 tokens > 64 blocks × 4
	}
	for _, rq := range cases {
		if _, err := c.Add(rq, time.Time{}); err == nil {
			t.Errorf("%+v accepted", rq)
		}
	}
	if _, err := c.AddHashed(req("h", make([]kv.Token, 9), 1), []kv.LocalHash{1}, time.Time{}); err == nil {
		t.Error("wrong local hash count accepted")
	}
	if !c.Idle() {
		t.Fatal("rejected requests were queued")
	}
	for _, bad := range []func(*Config){
		func(c *Config) { c.Role = "mixer" },
		func(c *Config) { c.BlockSize = -1 },
		func(c *Config) { c.Watermark = 1 },
		func(c *Config) { c.SpeedupRatio = -1 },
		func(c *Config) { c.Layers = -1 },
	} {
		cfg := testConfig()
		bad(&cfg)
		if _, err := NewCore(cfg); err == nil {
			t.Errorf("config %+v accepted", cfg)
		}
	}
}

// TestAddHashedEqualsAdd: precomputed hashes, or a prompt given only by its
// hashes and tail, behave exactly like the tokens.
func TestAddHashedEqualsAdd(t *testing.T) {
	cfg := testConfig()
	cores := []*Core{mustCore(t, cfg), mustCore(t, cfg), mustCore(t, cfg), mustCore(t, cfg)}
	hs := make([]*holdings, 4)
	for i, c := range cores {
		hs[i] = newHoldings(t, cfg.Worker, cfg.BlockSize)
		c.SetEventSink(hs[i].sink)
	}
	prompt := []kv.Token{9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11}
	rq := req("x", prompt, 9)
	local := kv.NewHasher(cfg.BlockSize, "", "").Local(prompt)
	sa, _ := cores[0].Add(rq, time.Time{})
	sb, err := cores[1].AddHashed(rq, local, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := cores[2].AddPrompt(&engine.Request{ID: "x", Sampling: kv.Sampling{MaxTokens: 9, Seed: 1}}, Prompt{Len: 11, Local: local, Tail: prompt[8:]}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	// With the router's sequence hashes too.
	sd, err := cores[3].AddPrompt(&engine.Request{ID: "x", Sampling: kv.Sampling{MaxTokens: 9, Seed: 1}}, Prompt{Len: 11, Local: local, Tail: prompt[8:], Seq: kv.SeqHashes(nil, local)}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	for !cores[0].Idle() || !cores[1].Idle() || !cores[2].Idle() || !cores[3].Idle() {
		for _, c := range cores {
			c.Step(time.Time{})
		}
	}
	for _, s := range []*Seq{sb, sc, sd} {
		if !slices.Equal(sa.Output(), s.Output()) || !slices.Equal(sa.seqh, s.seqh) {
			t.Fatal("a hashed prompt diverged from its tokens")
		}
	}
	for i, h := range hs {
		if err := h.matches(cores[i]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cores[2].AddPrompt(&engine.Request{ID: "bad", Sampling: kv.Sampling{MaxTokens: 1}}, Prompt{Len: 11, Local: local, Tail: prompt[7:]}, time.Time{}); err == nil {
		t.Fatal("a tail of the wrong length was accepted")
	}
	if _, err := cores[2].AddPrompt(&engine.Request{ID: "bad", Sampling: kv.Sampling{MaxTokens: 1}}, Prompt{Len: 11, Local: local, Tail: prompt[8:], Seq: []kv.SeqHash{1, 2, 3}}, time.Time{}); err == nil {
		t.Fatal("sequence hashes of the wrong length were accepted")
	}
}

func TestStats(t *testing.T) {
	cfg := testConfig()
	cfg.MaxBatchedTokens = 8
	c := mustCore(t, cfg)
	c.Add(req("a", make([]kv.Token, 20), 2), time.Time{})
	c.Add(req("b", make([]kv.Token, 5), 2), time.Time{})
	st := c.Stats()
	if st.Waiting != 2 || st.Running != 0 || st.PendingPrefillTokens != 25 || st.TotalBlocks != 64 || st.UsedBlocks != 0 {
		t.Fatalf("before: %+v", st)
	}
	c.Step(time.Time{}) // 8 tokens of a
	st = c.Stats()
	if st.Waiting != 1 || st.Running != 1 || st.PendingPrefillTokens != 17 || st.UsedBlocks != 2 {
		t.Fatalf("after one chunk: %+v", st)
	}
}

// TestStepAllocatesNothing: a steady pass (decode, block completion and
// registration included) allocates nothing when no sink is attached.
func TestStepAllocatesNothing(t *testing.T) {
	cfg := DefaultConfig()
	c := mustCore(t, cfg)
	for i := 0; i < 8; i++ {
		prompt := make([]kv.Token, 100+i*50)
		for j := range prompt {
			prompt[j] = kv.Token(i*1000 + j)
		}
		c.Add(req(fmt.Sprint(i), prompt, 1000), time.Time{})
	}
	now := time.Time{}
	for i := 0; i < 5; i++ { // prefill
		now = c.Step(now).End
	}
	allocs := testing.AllocsPerRun(500, func() { now = c.Step(now).End })
	if allocs != 0 {
		t.Fatalf("%.2f allocations per pass", allocs)
	}
	if st := c.Stats(); st.Running != 8 {
		t.Fatalf("stats %+v", st)
	}
}

// The admission shortcuts (a remembered refusal, the one-lookup bound)
// refuse exactly what a full prefix match would: a tight pool under long
// prompts with shared prefixes runs pass for pass the same with them off.
func TestAdmitShortcutsChangeNothing(t *testing.T) {
	type pass struct {
		seqs, tokens, prefill, preempted int
		outs                             string
	}
	run := func(seed uint64, on bool) ([]pass, Counters, uint64) {
		r := rand.New(rand.NewPCG(seed, 8))
		cfg := testConfig()
		cfg.FullAdmitMatch = !on
		cfg.Blocks, cfg.MaxBatchedTokens, cfg.MaxSeqs = 64, 24, 8
		c := mustCore(t, cfg)
		prefixes := make([][]kv.Token, 3)
		for i := range prefixes {
			prefixes[i] = make([]kv.Token, 40+r.IntN(60))
			for j := range prefixes[i] {
				prefixes[i][j] = kv.Token(r.IntN(1000))
			}
		}
		var passes []pass
		now := time.Unix(0, 0)
		for step := 0; step < 3000 && (step < 1500 || !c.Idle()); step++ {
			if step < 1500 && r.IntN(3) == 0 {
				toks := slices.Clone(prefixes[r.IntN(len(prefixes))])
				for j := r.IntN(30); j >= 0; j-- {
					toks = append(toks, kv.Token(r.IntN(1000)))
				}
				max := 1 + r.IntN(120)
				if kv.BlocksNeeded(len(toks)+max, cfg.BlockSize) <= cfg.Blocks {
					if _, err := c.Add(req(fmt.Sprint(step), toks, max), now); err != nil {
						t.Fatal(err)
					}
				}
			}
			res := c.Step(now)
			p := pass{res.Seqs, res.BatchedTokens, res.PrefillTokens, res.Preempted, ""}
			for _, o := range res.Outputs {
				p.outs += fmt.Sprint(o.Seq.ID(), o.Token, o.Finish, " ")
			}
			passes = append(passes, p)
			now = res.End.Add(time.Millisecond)
		}
		return passes, c.Counters(), c.shortcut
	}
	for seed := uint64(1); seed <= 4; seed++ {
		got, gc, n := run(seed, true)
		want, wc, off := run(seed, false)
		if off != 0 {
			t.Fatalf("seed %d: %d refusals by a shortcut with FullAdmitMatch set", seed, off)
		}
		if n == 0 {
			t.Fatalf("seed %d: no admission was refused by a shortcut: the load is not tight enough to test them", seed)
		}
		if !slices.Equal(got, want) || gc != wc {
			t.Fatalf("seed %d: with the shortcuts (%d refusals): %d passes, %+v; without: %d passes, %+v", seed, n, len(got), gc, len(want), wc)
		}
	}
}

// A refusal is not remembered past a change of the pool that lets the
// request in: b would reuse a's 8 idle cached blocks (taking them off the
// evictable list) and needs 4 more for its first chunk, which c's pinned
// blocks leave no room for; released pins make room with nothing else
// changed (the same head, no request active, the same budget), and the
// next pass admits b.
func TestAdmitAfterPinRelease(t *testing.T) {
	cfg := testConfig()
	cfg.Blocks, cfg.MaxBatchedTokens = 16, 16
	c := mustCore(t, cfg)
	now := time.Unix(1, 0)
	c.Add(req("a", seqTokens(0, 32), 1), now)
	for !c.Idle() {
		c.Step(now)
	}
	cs, _ := c.Add(req("c", seqTokens(500, 20), 1), now)
	for !c.Idle() {
		c.Step(now)
	}
	n, release := c.Pin(cs.seqh)
	if n != 5 || c.pool.available() != 11 {
		t.Fatalf("pinned %d blocks, %d available; want 5 and 11", n, c.pool.available())
	}
	b, _ := c.Add(req("b", append(seqTokens(0, 32), seqTokens(1000, 20)...), 1), now)
	for range 3 {
		if res := c.Step(now); res.Seqs != 0 {
			t.Fatal("b was admitted while c's blocks were pinned")
		}
	}
	release()
	if res := c.Step(now); res.Seqs != 1 || b.Metrics().Scheduled.IsZero() || b.Metrics().CachedTokens != 32 {
		t.Fatalf("b was not admitted with its 32 cached tokens once the pins were released: %d scheduled, %+v", res.Seqs, b.Metrics())
	}
}

func seqTokens(from, n int) []kv.Token {
	out := make([]kv.Token, n)
	for i := range out {
		out[i] = kv.Token(from + i)
	}
	return out
}
