package tokenizer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
)

func chatBPE(t testing.TB) (*BPE, ChatTemplate) {
	t.Helper()
	tok, tmpl, err := Builtin()
	if err != nil {
		t.Fatal(err)
	}
	return tok.(*BPE), tmpl
}

// conversation renders turn after turn of a chat whose messages hold
// text the encoder could merge across any cut that was not a segment
// border: words, digits, spaces at the ends, emoji, and special-token
// text that Defuse must keep plain.
func conversation(tok *BPE, tmpl ChatTemplate, turns int, seed uint64) []string {
	r := rand.New(rand.NewPCG(seed, 7))
	words := []string{"hello", " world", "123", "4567", "  ", "\n", "naïve", "🙂", "<|im_end|>", "<|im_start|>user", "don't", "x", ".", "\t"}
	text := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteString(words[r.IntN(len(words))])
		}
		return b.String()
	}
	msgs := []Message{{Role: "system", Content: text(20)}}
	var out []string
	for range turns {
		msgs = append(msgs, Message{Role: "user", Content: text(5 + r.IntN(40))})
		safe := make([]Message, len(msgs))
		for i, m := range msgs {
			safe[i] = Message{Role: m.Role, Content: tok.Defuse(m.Content)}
		}
		s, err := tmpl.Render(safe, true)
		if err != nil {
			panic(err)
		}
		out = append(out, s)
		msgs = append(msgs, Message{Role: "assistant", Content: text(5 + r.IntN(40))})
	}
	return out
}

// Differential: every turn through the cache is the whole text's
// encoding, and the later turns reuse the earlier ones' tokens.
func TestPrefixCacheMatchesWholeEncoding(t *testing.T) {
	tok, tmpl := chatBPE(t)
	c := NewPrefixCache(tok, 1<<20)
	for seed := range uint64(20) {
		for turn, text := range conversation(tok, tmpl, 6, seed) {
			want, _ := tok.EncodeUpTo(text, true, 0)
			got, done, reused := c.EncodeUpTo("", text, 0)
			if !done || !slices.Equal(got, want) {
				t.Fatalf("seed %d turn %d: %d tokens, want %d (done %v)", seed, turn, len(got), len(want), done)
			}
			if turn > 0 && reused == 0 {
				t.Errorf("seed %d turn %d reused nothing of the turn before", seed, turn)
			}
			if reused >= len(want) {
				t.Errorf("seed %d turn %d reused %d of %d tokens: the new message was not encoded", seed, turn, reused, len(want))
			}
		}
	}
	st := c.Stats()
	if st.Off || st.Hits != 20*5 || st.Misses != 20 || st.Reused == 0 {
		t.Fatalf("stats %+v, want 100 hits, 20 misses, on", st)
	}
}

// The token limit means the same with and without the cache.
func TestPrefixCacheLimit(t *testing.T) {
	tok, tmpl := chatBPE(t)
	texts := conversation(tok, tmpl, 4, 99)
	whole, _ := tok.EncodeUpTo(texts[3], true, 0)
	for _, max := range []int{1, len(whole) / 2, len(whole) - 1, len(whole), len(whole) + 1} {
		c := NewPrefixCache(tok, 1<<20)
		for _, text := range texts[:3] {
			c.EncodeUpTo("", text, 0)
		}
		_, wantDone := tok.EncodeUpTo(texts[3], true, max)
		got, done, _ := c.EncodeUpTo("", texts[3], max)
		if done != wantDone {
			t.Fatalf("max %d of %d: done %v, want %v", max, len(whole), done, wantDone)
		}
		if done && !slices.Equal(got, whole) {
			t.Fatalf("max %d: wrong tokens", max)
		}
	}
}

// A wrong entry (as a tokenizer that merges across a cut would make) is
// caught by the first hits' verification: the answer is the whole
// encoding and the cache turns itself off.
func TestPrefixCacheVerificationTurnsOff(t *testing.T) {
	tok, tmpl := chatBPE(t)
	texts := conversation(tok, tmpl, 2, 5)
	c := NewPrefixCache(tok, 1<<20)
	c.EncodeUpTo("", texts[0], 0)
	for el := c.lru.Front(); el != nil; el = el.Next() {
		ids := el.Value.(*cached).ids
		ids[1]++ // poison
	}
	want, _ := tok.EncodeUpTo(texts[1], true, 0)
	got, done, reused := c.EncodeUpTo("", texts[1], 0)
	if !done || reused != 0 || !slices.Equal(got, want) {
		t.Fatalf("a poisoned entry was served (reused %d)", reused)
	}
	if !c.Stats().Off || c.lru.Len() != 0 || len(c.keys) != 0 {
		t.Fatalf("the cache stayed on: %+v, %d entries", c.Stats(), c.lru.Len())
	}
	if got, _, reused := c.EncodeUpTo("", texts[1], 0); reused != 0 || !slices.Equal(got, want) {
		t.Fatal("an off cache reused tokens")
	}
}

// The budget bounds the tokens held (the arrays' capacity); the oldest
// prompts go first.
func TestPrefixCacheBudget(t *testing.T) {
	tok, tmpl := chatBPE(t)
	c := NewPrefixCache(tok, 2000)
	for seed := range uint64(30) {
		for _, text := range conversation(tok, tmpl, 3, seed) {
			c.EncodeUpTo("", text, 0)
			if c.held > c.budget {
				t.Fatalf("holding %d tokens over a budget of %d", c.held, c.budget)
			}
		}
	}
	n := 0
	for el := c.lru.Front(); el != nil; el = el.Next() {
		n += cap(el.Value.(*cached).ids)
		for _, m := range el.Value.(*cached).cuts {
			if c.keys[m.key] != el {
				t.Fatal("a kept cut is not indexed")
			}
		}
	}
	if n != c.held || n == 0 {
		t.Fatalf("held %d, entries hold %d", c.held, n)
	}
	for k, el := range c.keys {
		if !slices.ContainsFunc(el.Value.(*cached).cuts, func(m cut) bool { return m.key == k }) {
			t.Fatal("an indexed cut belongs to no entry")
		}
	}
}

func TestPrefixCacheNeedsBPE(t *testing.T) {
	if NewPrefixCache(nil, 100) != nil {
		t.Fatal("a cache over no tokenizer")
	}
	tok, _ := chatBPE(t)
	if NewPrefixCache(tok, 0) != nil {
		t.Fatal("a cache with no budget")
	}
}

// BenchmarkChatTurns is what a conversation's turn costs to tokenize,
// whole and through the prefix cache warmed by the turns before: a turn
// adds about 1,000 tokens (a question and an answer).
func BenchmarkChatTurns(b *testing.B) {
	tok, tmpl := chatBPE(b)
	r := rand.New(rand.NewPCG(1, 2))
	para := func() string {
		var s strings.Builder
		for range 90 {
			fmt.Fprintf(&s, "word%d is %d, ", r.IntN(5000), r.IntN(1000))
		}
		return s.String()
	}
	msgs := []Message{{Role: "system", Content: para()}}
	var texts []string
	for range 16 {
		msgs = append(msgs, Message{Role: "user", Content: para()})
		s, _ := tmpl.Render(msgs, true)
		texts = append(texts, s)
		msgs = append(msgs, Message{Role: "assistant", Content: para()})
	}
	for _, turn := range []int{1, 2, 4, 8, 16} {
		text := texts[turn-1]
		ids, _ := tok.EncodeUpTo(text, true, 0)
		b.Run(fmt.Sprintf("turn=%d/tokens=%d/whole", turn, len(ids)), func(b *testing.B) {
			for b.Loop() {
				tok.EncodeUpTo(text, true, 0)
			}
		})
		b.Run(fmt.Sprintf("turn=%d/tokens=%d/cached", turn, len(ids)), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				c := NewPrefixCache(tok, 1<<22)
				c.Verify(0)
				if turn > 1 {
					c.EncodeUpTo("", texts[turn-2], 0)
				}
				b.StartTimer()
				c.EncodeUpTo("", text, 0)
			}
		})
	}
}

// A start cached under one scope (a tenant's cache salt) is not found
// under another.
func TestPrefixCacheScopes(t *testing.T) {
	tok, tmpl := chatBPE(t)
	texts := conversation(tok, tmpl, 2, 11)
	c := NewPrefixCache(tok, 1<<20)
	c.EncodeUpTo("tenant-a", texts[0], 0)
	if _, _, reused := c.EncodeUpTo("tenant-b", texts[1], 0); reused != 0 {
		t.Fatalf("tenant-b reused %d tokens of tenant-a's prompt", reused)
	}
	if _, _, reused := c.EncodeUpTo("", texts[1], 0); reused != 0 {
		t.Fatalf("no scope reused %d tokens of tenant-a's prompt", reused)
	}
	if _, _, reused := c.EncodeUpTo("tenant-a", texts[1], 0); reused == 0 {
		t.Fatal("tenant-a did not reuse its own prompt")
	}
}

// BenchmarkPrefixCutKeys is what a prompt's bytes cost the prefix cache
// before any tokenizing: finding the cuts and hashing the text before
// each, over 16 turns of plain prose (~60 KB, 31 messages). It is the
// cache's O(bytes) part, which a turn pays over its whole history (MB/s).
func BenchmarkPrefixCutKeys(b *testing.B) {
	tok, tmpl := chatBPE(b)
	var msgs []Message
	for turn := range 16 {
		var s strings.Builder
		for i := range 90 {
			fmt.Fprintf(&s, "answer %d is %d, ", turn*1000+i, i*7)
		}
		msgs = append(msgs, Message{Role: "user", Content: s.String()}, Message{Role: "assistant", Content: s.String()})
	}
	text, err := tmpl.Render(msgs[:31], true)
	if err != nil {
		b.Fatal(err)
	}
	c := NewPrefixCache(tok, 1<<20)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		c.cutKeys("salt", text, 0, nil, -1)
	}
}

// EncodeFrom resuming where the turn before's scan stood at the end of its
// messages gives a whole tokenization's tokens, and finds the turn
// before's prompt (or its kept answer) as the whole scan does.
func TestPrefixCacheEncodeFrom(t *testing.T) {
	tok, tmpl := chatBPE(t)
	a := NewChatAppender(tok, tmpl)
	r := rand.New(rand.NewPCG(3, 4))
	words := []string{"hello", " world", "123", "  ", "\n", "naïve", "🙂", "<|im_end|>", "<|im_start|>user", "don't", "."}
	text := func() string {
		var b strings.Builder
		for range 5 + r.IntN(30) {
			b.WriteString(words[r.IntN(len(words))])
		}
		return b.String()
	}
	for _, keep := range []bool{false, true} {
		c := NewPrefixCache(tok, 1<<20)
		c.Verify(1 << 30)
		for conv := range 20 {
			scope := fmt.Sprint("conv-", conv)
			msgs := []Message{{Role: "system", Content: text()}, {Role: "user", Content: text()}}
			var prev *RenderedChat
			var scan *CutScan
			for turn := range 5 {
				n := 0
				if prev != nil {
					n = prev.Messages()
				}
				rc, over, err := a.Render(prev, msgs[n:], 0)
				if err != nil || over {
					t.Fatal(err, over)
				}
				ids, done, reused, saved := c.EncodeRendered(scope, &rc, 0, scan, rc.MessagesEnd(), nil)
				if !done || !slices.Equal(ids, tok.EncodeWithSpecial(rc.Text())) {
					t.Fatalf("turn %d: the tokens differ from a whole tokenization", turn)
				}
				if turn > 0 && reused == 0 {
					t.Fatalf("keep %v, turn %d: nothing reused", keep, turn)
				}
				if saved == nil || saved.at != rc.MessagesEnd() {
					t.Fatalf("turn %d: no scan saved at the end of the messages (%d): %+v", turn, rc.MessagesEnd(), saved)
				}
				answer := text()
				if keep {
					c.EncodeUpTo(scope, rc.Text()+tok.Defuse(answer)+"<|im_end|>", 0)
				}
				msgs = append(msgs, Message{Role: "assistant", Content: answer}, Message{Role: "user", Content: text()})
				p := rc
				prev, scan = &p, saved
			}
		}
		if st := c.Stats(); st.Off {
			t.Fatalf("keep %v: a hit's tokens differed from the whole tokenization: %+v", keep, st)
		}
	}
}

// A kept answer's tokens have room past them that the first prompt reusing
// all of them appends in, once: every prompt's tokens are a whole
// tokenization's, none that was handed out changes afterwards (a retry of
// the same turn, a branch, concurrent turns), and the turns after a kept
// answer did append in place.
func TestPrefixCacheKeepHandsSpareOnce(t *testing.T) {
	tok, tmpl := chatBPE(t)
	a := NewChatAppender(tok, tmpl)
	c := NewPrefixCache(tok, 1<<22)
	c.Verify(1 << 30)
	var mu sync.Mutex
	type handed struct{ ids, was []uint32 }
	var out []handed
	encode := func(scope string, rc RenderedChat, scan *CutScan) ([]uint32, *CutScan) {
		ids, done, _, saved := c.EncodeRendered(scope, &rc, 0, scan, rc.MessagesEnd(), nil)
		if !done || !slices.Equal(ids, tok.EncodeWithSpecial(rc.Text())) {
			t.Errorf("%s: the tokens differ from a whole tokenization", scope)
		}
		mu.Lock()
		out = append(out, handed{ids, slices.Clone(ids)})
		mu.Unlock()
		return ids, saved
	}
	var wg sync.WaitGroup
	inPlace := 0
	for conv := range 8 {
		r := rand.New(rand.NewPCG(uint64(conv), 5))
		words := []string{"hello", " world", "123", "  ", "\n", "naïve", "🙂", "<|im_end|>", "don't", "."}
		text := func() string {
			var b strings.Builder
			for range 5 + r.IntN(60) {
				b.WriteString(words[r.IntN(len(words))])
			}
			return b.String()
		}
		scope := fmt.Sprint("conv-", conv)
		msgs := []Message{{Role: "system", Content: text()}, {Role: "user", Content: text()}}
		var prev *RenderedChat
		var scan *CutScan
		for turn := range 6 {
			n := 0
			if prev != nil {
				n = prev.Messages()
			}
			rc, _, err := a.Render(prev, msgs[n:], 0)
			if err != nil {
				t.Fatal(err)
			}
			ids, saved := encode(scope, rc, scan)
			if turn > 0 && cap(ids) > len(ids) {
				inPlace++
			}
			if conv%2 == 1 {
				encode(scope, rc, scan) // the same turn again (a retry)
			}
			answer := text()
			c.Keep(scope, rc.Text()+tok.Defuse(answer)+"<|im_end|>", saved, nil)
			msgs = append(msgs, Message{Role: "assistant", Content: answer}, Message{Role: "user", Content: text()})
			if conv%2 == 1 {
				// The answer edited (reuses the kept answer's start only),
				// then branches of the next turn at once (all of it).
				edited := append(slices.Clone(msgs[:len(msgs)-2]), Message{Role: "assistant", Content: "edited" + answer}, msgs[len(msgs)-1])
				erc, _, _ := a.Render(nil, edited, 0)
				encode(scope, erc, nil)
				for b := range 3 {
					branch := append(slices.Clone(msgs[:len(msgs)-1]), Message{Role: "user", Content: fmt.Sprint("branch ", b, text())})
					wg.Add(1)
					go func() {
						defer wg.Done()
						brc, _, _ := a.Render(nil, branch, 0)
						encode(scope, brc, nil)
					}()
				}
				wg.Wait()
			}
			p := rc
			prev, scan = &p, saved
		}
	}
	for i, h := range out {
		if !slices.Equal(h.ids, h.was) {
			t.Fatalf("prompt %d's tokens changed after they were handed out", i)
		}
	}
	if st := c.Stats(); st.Off || inPlace < 8*5/2 {
		t.Fatalf("%d of %d later turns appended in place; %+v", inPlace, 8*5, st)
	}
}
