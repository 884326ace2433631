package tokenizer

import (
	"container/list"
	"encoding/binary"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/zeebo/xxh3"
)

// PrefixCache makes a conversation's later turns tokenize only what is
// new. Every turn resends the whole history, rendered by the chat template
// into a text whose start is the previous turn's text; the cache keeps the
// tokens of a rendered prompt's starts and reuses the longest one the next
// prompt begins with.
//
// The cuts are where the encoder matches an added token (the template's
// markers: <|im_start|>, <|eot_id|>, ...). The encoder tokenizes the text
// between added tokens segment by segment, so tokens(text) is exactly
// tokens(text[:cut]) followed by tokens(text[cut:]) there, whatever the
// template. A start is found by the xxh3-128 of the text before the cut
// (one pass over the prompt); nothing assumes the template is
// prefix-stable: one that is not just misses. The first hits are checked
// against a full tokenization anyway, and a mismatch turns the cache off.
//
// It holds the token arrays of the most recent prompts, up to a budget of
// tokens, least recently used first out; a prompt's entry is found by its
// last few cuts (the end of the previous turn is among them). Safe for
// concurrent use.
type PrefixCache struct {
	t      *BPE
	budget int

	mu      sync.Mutex
	keys    map[xxh3.Uint128]*list.Element // a cut's prefix hash → its prompt
	lru     list.List                      // *cached, most recent first
	held    int                            // tokens lru's arrays hold (their capacity; a shared array once per entry)
	toCheck int                            // hits still verified by a full tokenization

	off                       atomic.Bool
	hits, misses, reusedTotal atomic.Int64
}

// cached is one prompt's tokens and the prefixes of it the cache finds.
type cached struct {
	ids  []uint32
	cuts []cut
	note any // the caller's (NoteFunc), nil: none
	// spare: ids' array past its last cut is the cache's alone (Keep's
	// entries: no caller holds their ids, and hits read ids only up to a
	// cut), and is handed once to a hit at that cut, which appends its
	// tokens there instead of copying the start (handed).
	spare  bool
	last   int // the last cut's tokens
	handed atomic.Bool
}

// keepHeadroom is the room a kept prompt's array has past its tokens, for
// the next turn to append its own: a question and the markers around it.
func keepHeadroom(n int) int { return n/8 + 1024 }

// NoteFunc makes the note a prompt's entry keeps, for the prompts that
// later reuse a start of its tokens: the caller's value, made once the
// tokens (ids, read-only) are final. from is the note of the entry whose
// first reused tokens ids start with (copied from it, so equal by
// construction; nil on a miss). The frontend keeps there the block hashes
// routing computed for the tokens, so a later turn's router hashes only
// the blocks past them.
type NoteFunc func(from any, reused int, ids []uint32) any

type cut struct {
	key    xxh3.Uint128
	tokens int // ids[:tokens] are the prefix's tokens
}

// prefixCuts is how many of a prompt's last cuts are kept: the previous
// turn's end is the last or close to it (the generation prompt's markers
// follow it).
const prefixCuts = 4

// prefixChecks is how many hits are verified by a full tokenization
// before the cache is trusted.
const prefixChecks = 16

// NewPrefixCache returns a cache over t's special-token encoding holding up
// to budget tokens, or nil when t is not one whose cuts it knows: the
// caller then encodes whole.
func NewPrefixCache(t Tokenizer, budget int) *PrefixCache {
	b, ok := t.(*BPE)
	if !ok || budget <= 0 {
		return nil
	}
	return &PrefixCache{t: b, budget: budget, keys: map[xxh3.Uint128]*list.Element{}, toCheck: prefixChecks}
}

// Verify sets how many of the next hits are checked against a whole
// encoding (prefixChecks at first).
func (c *PrefixCache) Verify(hits int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.toCheck = hits
}

// PrefixStats are a cache's counts so far.
type PrefixStats struct {
	Hits, Misses int64
	Reused       int64 // tokens taken from the cache instead of encoded
	Off          bool  // a verification failed: the cache no longer serves
}

// Stats reports the cache's counts.
func (c *PrefixCache) Stats() PrefixStats {
	return PrefixStats{Hits: c.hits.Load(), Misses: c.misses.Load(), Reused: c.reusedTotal.Load(), Off: c.off.Load()}
}

// EncodeUpTo is the tokenizer's EncodeUpTo(text, true, max) reusing the
// longest cached start of text that was encoded under the same scope;
// reused is how many of ids came from the cache. A scope keeps tenants
// apart (the frontend passes the request's cache salt): a hit is faster,
// so across scopes it would tell one tenant what another sent. The caller
// must not write to ids: the cache keeps them.
func (c *PrefixCache) EncodeUpTo(scope, text string, max int) (ids []uint32, done bool, reused int) {
	ids, done, reused, _ = c.EncodeFrom(scope, text, max, nil, -1, nil)
	return ids, done, reused
}

// CutScan is where an earlier scan of a text's cuts stood at one of them,
// so that a text starting with the same bytes under the same scope is
// scanned from there on (a conversation's next turn, whose text starts
// with the turn before's messages).
type CutScan struct {
	h  xxh3.Hasher // scope and text[:at] written
	at int
}

// EncodeFrom is EncodeUpTo whose scan for cuts starts at from (nil: the
// start), which an earlier EncodeFrom under scope returned for a text
// whose first from.at bytes text starts with (the caller knows: it
// compared them); only hits of cuts past it are looked for. It returns
// where the scan stood at the cut at offset save (nil when there is no
// cut there, or it was not reached). When the tokens are kept, note (nil:
// none) makes the note kept with them.
func (c *PrefixCache) EncodeFrom(scope, text string, max int, from *CutScan, save int, note NoteFunc) (ids []uint32, done bool, reused int, saved *CutScan) {
	return c.encodeFrom(scope, splitText{tail: text}, max, from, save, note, false)
}

// EncodeRendered is EncodeFrom of rc's text that, when from stood where
// rc's last piece starts (the turn before's messages end: ChatAppender's
// rc after the rendering whose scan from is), reads only that piece on a
// hit: the history's text is not built. A miss, a first hit checked whole
// and any other from build it (rc.Text).
func (c *PrefixCache) EncodeRendered(scope string, rc *RenderedChat, max int, from *CutScan, save int, note NoteFunc) (ids []uint32, done bool, reused int, saved *CutScan) {
	at, tail := rc.Tail()
	return c.encodeFrom(scope, splitText{at: at, tail: tail, rc: rc}, max, from, save, note, false)
}

// splitText is a text as its tail from offset at on, and the whole (rc's
// text; tail when rc is nil, at 0).
type splitText struct {
	at   int
	tail string
	rc   *RenderedChat
}

func (p splitText) whole() string {
	if p.rc == nil {
		return p.tail
	}
	return p.rc.Text()
}

// Keep encodes text into the cache for the prompts that will start with
// it (a conversation's answer, which its next turn resends), scanning from
// from as EncodeFrom does. The tokens are the cache's alone: their array
// has room past them, which the first prompt that reuses all of them
// appends its own tokens in, instead of copying them.
func (c *PrefixCache) Keep(scope, text string, from *CutScan, note NoteFunc) {
	c.encodeFrom(scope, splitText{tail: text}, 0, from, -1, note, true)
}

func (c *PrefixCache) encodeFrom(scope string, t splitText, max int, from *CutScan, save int, note NoteFunc, keep bool) (ids []uint32, done bool, reused int, saved *CutScan) {
	if c.off.Load() {
		ids, done = c.t.EncodeUpTo(t.whole(), true, max)
		return ids, done, 0, nil
	}
	if t.at > 0 && (from == nil || from.at != t.at) {
		t = splitText{tail: t.whole()} // the scan starts elsewhere: it reads the whole
	}
	keys, offs, saved := c.cutKeys(scope, t.tail, t.at, from, save)
	prefix, at, fromNote := c.lookup(keys, offs, max)
	if prefix == nil || (max > 0 && len(prefix) >= max) {
		c.misses.Add(1)
		var marks []cut
		ids, done = c.t.encodeMarked(t.whole(), true, max, func(i, n int) {
			marks = append(marks, cut{tokens: n, key: keyAt(keys, offs, i)})
		})
		if done {
			c.store(ids, marks, note, nil, 0, keep)
		}
		return ids, done, 0, saved
	}
	rest := 0
	if max > 0 {
		rest = max - len(prefix) // ≥ 1: past it the whole would be past max
	}
	var marks []cut
	tail, done := c.t.encodeMarked(t.tail[at-t.at:], true, rest, func(i, n int) {
		marks = append(marks, cut{tokens: len(prefix) + n, key: keyAt(keys, offs, at+i)})
	})
	switch n := len(prefix) + len(tail); {
	case n <= cap(prefix):
		// The array past prefix was handed to this prompt (lookup).
		ids = append(prefix, tail...)
	case keep:
		ids = make([]uint32, n, n+keepHeadroom(n))
		copy(ids, prefix)
		copy(ids[len(prefix):], tail)
	default:
		ids = make([]uint32, n)
		copy(ids, prefix)
		copy(ids[len(prefix):], tail)
	}
	if !done {
		return ids, false, len(prefix), saved
	}
	if c.verify() {
		whole, _ := c.t.EncodeUpTo(t.whole(), true, max)
		if !slices.Equal(whole, ids) {
			c.turnOff()
			return whole, true, 0, nil
		}
	}
	c.hits.Add(1)
	c.reusedTotal.Add(int64(len(prefix)))
	c.store(ids, marks, note, fromNote, len(prefix), keep)
	return ids, true, len(prefix), saved
}

// cutKeys finds the cuts of a text (the offsets where the encoder matches
// an added token) and the hash of scope and the text before each, in one
// pass, from from on (nil: the start); saved is the scan at the cut at
// offset save, if there is one. text is the text from offset base on
// (base > 0 only with from at base).
func (c *PrefixCache) cutKeys(scope, text string, base int, from *CutScan, save int) (keys []xxh3.Uint128, offs []int, saved *CutScan) {
	var h xxh3.Hasher
	last := 0
	if from != nil && from.at >= base && from.at-base <= len(text) {
		h, last = from.h, from.at-base
	} else {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(scope))) // length first: no scope is another's prefix
		_, _ = h.Write(n[:])
		_, _ = h.WriteString(scope)
	}
	for i := last; i < len(text); {
		if i = c.t.nextAdded(text, i); i == len(text) {
			break
		}
		a, ok := c.t.addedAt(text, i, true)
		if !ok {
			i++
			continue
		}
		if base+i > 0 {
			_, _ = h.WriteString(text[last:i])
			last = i
			keys = append(keys, h.Sum128())
			offs = append(offs, base+i)
			if base+i == save {
				saved = &CutScan{h: h, at: base + i}
			}
		}
		i += len(a.content)
	}
	return keys, offs, saved
}

// keyAt is the key of the cut at offset i (a zero key when the encoder
// cut where the scan did not: it is never found).
func keyAt(keys []xxh3.Uint128, offs []int, i int) xxh3.Uint128 {
	if j, ok := slices.BinarySearch(offs, i); ok {
		return keys[j]
	}
	return xxh3.Uint128{}
}

// lookup finds the longest cached start among the cuts: its tokens, the
// offset in text where it ends and its entry's note. The tokens' capacity
// is theirs alone, unless the start is all of a kept entry's (its last
// cut) whose spare room no hit took yet: then it runs to the array's end,
// for this prompt to append in (max is not reached by the start).
func (c *PrefixCache) lookup(keys []xxh3.Uint128, offs []int, max int) ([]uint32, int, any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for j := len(keys) - 1; j >= 0; j-- {
		el, ok := c.keys[keys[j]]
		if !ok {
			continue
		}
		e := el.Value.(*cached)
		for _, ct := range e.cuts {
			if ct.key == keys[j] {
				c.lru.MoveToFront(el)
				if e.spare && ct.tokens == e.last && (max <= 0 || ct.tokens < max) && e.handed.CompareAndSwap(false, true) {
					return e.ids[:ct.tokens:cap(e.ids)], offs[j], e.note
				}
				return e.ids[:ct.tokens:ct.tokens], offs[j], e.note
			}
		}
	}
	return nil, 0, nil
}

// store keeps ids under their last cuts, with note's note (fromNote: the
// note of the entry whose first reused tokens ids start with), evicting
// the least recently used prompts past the budget; spare: no caller holds
// ids (Keep).
func (c *PrefixCache) store(ids []uint32, marks []cut, note NoteFunc, fromNote any, reused int, spare bool) {
	var zero xxh3.Uint128
	marks = slices.DeleteFunc(marks, func(m cut) bool { return m.key == zero || m.tokens == 0 })
	if len(marks) == 0 || cap(ids) > c.budget {
		return
	}
	if len(marks) > prefixCuts {
		marks = marks[len(marks)-prefixCuts:]
	}
	e := &cached{ids: ids, cuts: slices.Clone(marks), spare: spare, last: marks[len(marks)-1].tokens}
	if note != nil {
		e.note = note(fromNote, reused, ids)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.off.Load() {
		return
	}
	el := c.lru.PushFront(e)
	c.held += cap(ids)
	for _, m := range e.cuts {
		if old, ok := c.keys[m.key]; ok && old != el {
			// A newer prompt with the same start: it answers from now on.
			c.dropCut(old, m.key)
		}
		c.keys[m.key] = el
	}
	for c.held > c.budget {
		back := c.lru.Back()
		c.evict(back)
	}
}

// dropCut forgets one cut of el's prompt; a prompt left with none goes.
func (c *PrefixCache) dropCut(el *list.Element, key xxh3.Uint128) {
	e := el.Value.(*cached)
	e.cuts = slices.DeleteFunc(e.cuts, func(m cut) bool { return m.key == key })
	if len(e.cuts) == 0 {
		c.lru.Remove(el)
		c.held -= cap(e.ids)
	}
}

func (c *PrefixCache) evict(el *list.Element) {
	e := el.Value.(*cached)
	for _, m := range e.cuts {
		if c.keys[m.key] == el {
			delete(c.keys, m.key)
		}
	}
	c.lru.Remove(el)
	c.held -= cap(e.ids)
}

// verify reports whether this hit is one of the first, checked whole.
func (c *PrefixCache) verify() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.toCheck > 0 {
		c.toCheck--
		return true
	}
	return false
}

// turnOff stops serving from the cache and drops what it holds.
func (c *PrefixCache) turnOff() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.off.Store(true)
	clear(c.keys)
	c.lru.Init()
	c.held = 0
}
