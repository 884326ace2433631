package frontend

import (
	"bytes"
	"container/list"
	"encoding/binary"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/zeebo/xxh3"

	"github.com/kvmesh/kvmesh/tokenizer"
)

// chatMemo makes a conversation's later turn parse and render only what
// is new. Every turn resends the whole history: its body starts with the
// bytes of the turn before's body up to the end of that turn's last
// message. The memo keeps, for recent chat bodies, those bytes, the
// messages parsed from them, the fields before them and their rendering;
// a body that starts with the same bytes is compared to them (memcmp
// speed, not a validating scan) and only its rest is split, validated and
// rendered. Anything the rest does not make a plain success of (bad JSON,
// a bad field, a repeated messages key, a render error) goes the whole
// way instead, so a bad body gets exactly the answer it would without the
// memo.
//
// Scoped by cache salt like the prefix cache: an entry is found only under
// the salt its request had, and used only when the new request's parsed
// salt is that one, so a hit (faster) tells a tenant nothing of another's
// requests. The lookup's salt is read from the body's first and last
// bytes before it is parsed (where clients put top-level fields); a body
// whose salt is elsewhere just misses.
//
// Bounded by bytes held (the bodies, the messages' contents, the
// renderings), least recently used out; a turn's entry replaces the turn
// before's. Safe for concurrent use: entries are immutable once stored.
type chatMemo struct {
	budget int

	mu   sync.Mutex
	keys map[xxh3.Uint128]*list.Element // one per entry
	lru  list.List                      // *memoEntry, most recent first
	held int

	hits, rendered atomic.Int64 // bodies read from an entry; of them, rendered after its text
}

// memoEntry is one chat body's start: its bytes up to the end of its
// last message (end of them), the fields before its messages key, the
// messages and (for the model that rendered them) their rendering.
type memoEntry struct {
	key  xxh3.Uint128
	salt string
	// The bytes, the memo's own (the request's buffer is recycled): the
	// turn before's pieces, shared, and a copy of what this turn added.
	pieces  [][]byte
	end     int
	msgsAt  int // the messages value's offset in b
	before  fields
	msgs    []Message
	render  *tokenizer.ChatAppender
	written tokenizer.RenderedChat // render's text of msgs (with the generation prompt)
	scan    *tokenizer.CutScan     // the prefix cache's scan of it at the end of msgs (nil: none)
	size    int
}

const (
	// memoMinBody: shorter bodies parse in a few µs; not worth an entry.
	memoMinBody = 2 << 10
	// chatMemoBytes is the default budget.
	chatMemoBytes = 32 << 20
	// memoSaltWindow: how far from each end of a body the lookup looks for
	// cache_salt.
	memoSaltWindow = 1 << 10
)

func newChatMemo(budget int) *chatMemo {
	if budget <= 0 {
		return nil
	}
	return &chatMemo{budget: budget, keys: map[xxh3.Uint128]*list.Element{}}
}

// memoKeys are the keys of salt and a body's first 2 KB, 4 KB, 8 KB, …:
// an entry is stored under the key of its start's largest power-of-two
// length, which a body that continues it shares.
type memoKeys struct {
	salt string
	keys [40]xxh3.Uint128 // keys[i]: b[:memoMinBody<<i]
	n    int
}

// keysOf hashes salt and b's first limit bytes, in one pass.
func keysOf(salt string, b []byte, limit int) memoKeys {
	k := memoKeys{salt: salt}
	var h xxh3.Hasher
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(salt))) // length first: no salt is another's prefix
	_, _ = h.Write(n[:])
	_, _ = h.WriteString(salt)
	at := 0
	for l := memoMinBody; l <= limit && k.n < len(k.keys); l *= 2 {
		_, _ = h.Write(b[at:l])
		at = l
		k.keys[k.n] = h.Sum128()
		k.n++
	}
	return k
}

// at is the key of the first n bytes (n a power of two ≥ memoMinBody).
func (k *memoKeys) at(n int) (xxh3.Uint128, bool) {
	i := bits.Len(uint(n/memoMinBody)) - 1
	return k.keys[i], i < k.n
}

// floorPow2 is the largest power of two ≤ n (n ≥ 1).
func floorPow2(n int) int { return 1 << (bits.Len(uint(n)) - 1) }

// lookup finds an entry whose start b begins with, under the salt that b
// appears to have (the caller still checks the parsed salt); keys are
// b's, for storing it after.
func (c *chatMemo) lookup(b []byte) (hit *memoEntry, keys memoKeys) {
	if c == nil || len(b) <= memoMinBody {
		return nil, keys
	}
	keys = keysOf(saltGuess(b), b, len(b)-1)
	for i := keys.n - 1; i >= 0; i-- {
		c.mu.Lock()
		el, ok := c.keys[keys.keys[i]]
		if ok {
			c.lru.MoveToFront(el)
		}
		c.mu.Unlock()
		if !ok {
			continue
		}
		e := el.Value.(*memoEntry)
		if e.salt == keys.salt && e.end < len(b) && e.startOf(b) {
			return e, keys
		}
	}
	return nil, keys
}

// startOf reports whether b starts with e's bytes.
func (e *memoEntry) startOf(b []byte) bool {
	at := 0
	for _, p := range e.pieces {
		if !bytes.Equal(b[at:at+len(p)], p) {
			return false
		}
		at += len(p)
	}
	return at == e.end
}

// memoMaxPieces bounds an entry's pieces (one per turn): past it they are
// joined into one, so a lookup's compare stays a few long runs.
const memoMaxPieces = 32

// own makes e's bytes and fields before its messages the memo's: body is
// the request's (trimmed) body, which continued prev when prev is not nil.
func (e *memoEntry) own(body []byte, prev *memoEntry) {
	if prev != nil && prev.end <= e.end && len(prev.pieces) < memoMaxPieces {
		// body[:prev.end] is prev's bytes (lookup compared them), and the
		// fields before the messages are prev's (continueChat).
		e.pieces = append(prev.pieces[:len(prev.pieces):len(prev.pieces)], bytes.Clone(body[prev.end:e.end]))
		return
	}
	e.pieces = [][]byte{bytes.Clone(body[:e.end])}
	if prev != nil {
		return // prev's fields: already the memo's
	}
	before := make(fields, len(e.before))
	for k, v := range e.before {
		before[k] = bytes.Clone(v)
	}
	e.before = before
}

// store keeps a parsed (and maybe rendered) chat body, whose keys lookup
// computed; prev is the entry its parse used (the same conversation's
// turn before), which it replaces. body is the request's (trimmed) body:
// the entry keeps a copy of what it needs.
func (c *chatMemo) store(e *memoEntry, body []byte, keys *memoKeys, prev *memoEntry) {
	if c == nil || e.end < memoMinBody || e.salt != keys.salt {
		return
	}
	key, ok := keys.at(floorPow2(e.end))
	if !ok {
		return
	}
	e.key = key
	e.size = e.end + e.written.Len() // its pieces: the turn before's shared, counted again
	for _, m := range e.msgs {
		e.size += len(m.Content) + 64
	}
	if e.size > c.budget/4 {
		return
	}
	e.own(body, prev)
	c.mu.Lock()
	defer c.mu.Unlock()
	if prev != nil {
		if el, ok := c.keys[prev.key]; ok && el.Value == prev {
			c.drop(el)
		}
	}
	if old, ok := c.keys[e.key]; ok {
		c.drop(old) // the same start again, or another conversation's: the newest answers
	}
	c.keys[e.key] = c.lru.PushFront(e)
	c.held += e.size
	for c.held > c.budget {
		c.drop(c.lru.Back())
	}
}

func (c *chatMemo) drop(el *list.Element) {
	e := el.Value.(*memoEntry)
	if c.keys[e.key] == el {
		delete(c.keys, e.key)
	}
	c.lru.Remove(el)
	c.held -= e.size
}

// saltGuess is the cache_salt a chat body seems to carry, read from its
// first and last memoSaltWindow bytes ("" when none is there as a plain
// string): the lookup's scope, checked against the parsed salt.
func saltGuess(b []byte) string {
	const key = `"cache_salt"`
	tail := b[max(len(b)-memoSaltWindow, 0):]
	if i := bytes.LastIndex(tail, []byte(key)); i >= 0 {
		return saltAt(tail, i+len(key))
	}
	if i := bytes.Index(b[:min(len(b), memoSaltWindow)], []byte(key)); i >= 0 {
		return saltAt(b, i+len(key))
	}
	return ""
}

func saltAt(b []byte, i int) string {
	i = skipSpace(b, i)
	if i >= len(b) || b[i] != ':' {
		return ""
	}
	i = skipSpace(b, i+1)
	if i >= len(b) || b[i] != '"' {
		return ""
	}
	end, plain := scanString(b, i)
	if end < 0 || !plain {
		return ""
	}
	return string(b[i+1 : end-1])
}

// continueChat parses body b, which starts with e's bytes, reading only
// what follows them: the messages after e's, the fields after the
// messages. ok is false when the rest is anything but a valid request
// read the plain way (the caller then parses b whole, which words every
// error).
func continueChat(b []byte, e *memoEntry) (r *chatRequest, cs chatSplit, ok bool) {
	var added []splitMessage
	last := e.end
	end := arrayRest(b, e.end, func(b []byte, i int) int {
		m, end := splitMessageAt(b, i)
		if end >= 0 {
			added = append(added, m)
			last = end
		}
		return end
	})
	if end < 0 {
		return nil, cs, false
	}
	f := make(fields, len(e.before)+8)
	for k, v := range e.before {
		f[k] = v
	}
	f["messages"] = b[e.msgsAt:end:end]
	next, oend := objectNext(b, end)
	if next >= 0 {
		oend = objectFields(b, next, 0, f, func(key string, b []byte, i int) int {
			if key == "messages" {
				return -1 // a repeated messages key: the whole way
			}
			return scanValue(b, i, 1)
		})
	}
	if oend < 0 || skipSpace(b, oend) != len(b) {
		return nil, cs, false
	}
	r = &chatRequest{}
	var err *apiError
	if r.Model, err = f.model(); err != nil {
		return nil, cs, false
	}
	r.Messages = make([]Message, len(e.msgs), len(e.msgs)+len(added))
	copy(r.Messages, e.msgs)
	for j, m := range added {
		msg, err := parseMessage(len(e.msgs)+j, m)
		if err != nil {
			return nil, cs, false
		}
		r.Messages = append(r.Messages, msg)
	}
	if r.genParams, err = f.genParams(true); err != nil {
		return nil, cs, false
	}
	cs = chatSplit{f: f, before: e.before, msgsAt: e.msgsAt, lastEnd: last, once: true}
	return r, cs, true
}

// parseChat is parseChat for the server: a body that starts with a memo
// entry's bytes (and has its salt) is read from where they end.
func (s *Server) parseChat(body []byte) (*chatRequest, *apiError) {
	b := bytes.TrimSpace(body)
	hit, keys := s.memo.lookup(b)
	if hit != nil {
		if r, cs, ok := continueChat(b, hit); ok && r.CacheSalt == hit.salt {
			r.body, r.split, r.memo, r.keys = b, cs, hit, keys
			s.memo.hits.Add(1)
			return r, nil
		}
	}
	r, err := parseChat(body)
	if err != nil {
		return nil, err
	}
	r.body, r.keys = b, keys
	return r, nil
}
