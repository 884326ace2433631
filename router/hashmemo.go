package router

import (
	"container/list"
	"math/bits"
	"sync"
	"unsafe"

	"github.com/zeebo/xxh3"

	"github.com/kvmesh/kvmesh/kv"
)

// hashMemo keeps recent prompts' block hashes, so that a prompt starting
// with an earlier prompt's blocks (a conversation's next turn resends the
// whole history) hashes and chains only its new blocks. What the memo
// gives is checked against the request's own tokens: an entry keeps the
// 128-bit xxh3 of its tokens up to marks (every markBlocks blocks and its
// end), the request's tokens are streamed through one xxh3 (a few GB/s on
// bytes the tokenizer just wrote, where the kept tokens would be cold, and
// without a call per block), and the blocks up to the last mark that
// agrees are taken; the rest is hashed afresh, as without the memo. A
// wrong reuse would take an xxh3-128 collision under the same seed (the
// request's own LoRA and salt), the standard the prefix caches keep.
//
// An entry is found by its seed (LoRA and salt), block size, its first
// block's local hash and the local hash of the last block of its largest
// power-of-two prefix (2^i blocks): a longer prompt that continues it has
// the same blocks there, and the lookup computes those few hashes, which
// are the prompt's own, anyway. One entry per key, the latest; bounded by
// the bytes its entries hold, least recently used out. Entries are
// immutable once stored: safe for concurrent use.
type hashMemo struct {
	budget int

	mu   sync.Mutex
	keys map[hashKey]*list.Element // *hashEntry
	lru  list.List                 // most recent first
	held int
}

type hashKey struct {
	seed         uint64
	bs           int
	level        int // the probe is block 2^level - 1
	first, probe kv.LocalHash
}

// hashEntry is one prompt's full blocks' hashes and the digests of their
// tokens at marks.
type hashEntry struct {
	key   hashKey
	marks []hashMark // ascending; the last is at len(local)
	local []kv.LocalHash
	seq   []kv.SeqHash
	size  int
}

// hashMark: sum is the xxh3-128 of the prompt's first blocks*bs tokens.
type hashMark struct {
	blocks int
	sum    xxh3.Uint128
}

// markBlocks spaces an entry's marks (besides its end), so that a prompt
// that differs from it near its end (a turn before's generation prompt
// tokenized otherwise) still takes most of it.
const markBlocks = 32

const (
	// hashMemoMinBlocks: shorter prompts hash in well under a µs.
	hashMemoMinBlocks = 4
	// hashMemoBytes is the memo's budget (~16 bytes a block: ~500k blocks).
	hashMemoBytes = 8 << 20
)

func newHashMemo(budget int) *hashMemo {
	if budget <= 0 {
		return nil
	}
	return &hashMemo{budget: budget, keys: map[hashKey]*list.Element{}}
}

// hashes returns the local and sequence hashes of the n full blocks of
// tokens (bs tokens each, seed kv.Seed(LoRA, salt)), in one new
// allocation that the memo keeps too (neither modifies it); from an
// earlier prompt's entry as far as its marks agree, and keeps them for a
// later one. reused is how many blocks came from the memo.
func (m *hashMemo) hashes(tokens []kv.Token, bs int, seed uint64, n int) (local []kv.LocalHash, seq []kv.SeqHash, reused int) {
	buf := make([]uint64, 2*n) // one allocation for both
	local = kv.AsHashes[kv.LocalHash](buf[:0:n])
	seq = kv.AsHashes[kv.SeqHash](buf[n : n : 2*n])
	if m == nil || n < hashMemoMinBlocks {
		local = kv.LocalHashes(local, tokens, bs, seed)
		return local, kv.SeqHashes(seq, local), 0
	}
	first := kv.HashTokens(tokens[:bs], seed)
	top := bits.Len(uint(n)) - 1
	var hit *hashEntry
	for i := top; i >= 0; i-- {
		b := 1<<i - 1
		probe := kv.HashTokens(tokens[b*bs:(b+1)*bs], seed)
		if e := m.get(hashKey{seed: seed, bs: bs, level: i, first: first, probe: probe}); e != nil {
			hit = e
			break
		}
	}
	// One stream over the prompt's full blocks: checks hit's marks, then
	// gives the new entry's.
	var h xxh3.Hasher
	at := 0 // blocks written to h
	var marks []hashMark
	if hit != nil {
		for _, mk := range hit.marks {
			if mk.blocks > n {
				break
			}
			_, _ = h.Write(tokenBytes(tokens[at*bs : mk.blocks*bs]))
			at = mk.blocks
			if h.Sum128() != mk.sum {
				break
			}
			reused = mk.blocks
			marks = append(marks, mk)
		}
		local = append(local, hit.local[:reused]...)
		seq = append(seq, hit.seq[:reused]...)
		if at > reused { // the stream went past the last mark that agreed
			h.Reset()
			_, _ = h.Write(tokenBytes(tokens[:reused*bs]))
			at = reused
		}
	}
	for next := (at/markBlocks + 1) * markBlocks; at < n; next += markBlocks {
		end := min(next, n)
		_, _ = h.Write(tokenBytes(tokens[at*bs : end*bs]))
		at = end
		marks = append(marks, hashMark{blocks: end, sum: h.Sum128()})
	}
	local = kv.LocalHashes(local, tokens[reused*bs:], bs, seed)
	if reused == 0 {
		seq = kv.SeqHashes(seq, local)
	} else {
		prev := seq[reused-1]
		for _, l := range local[reused:] {
			prev = kv.ChainHash(prev, l)
			seq = append(seq, prev)
		}
	}
	m.put(&hashEntry{key: hashKey{seed: seed, bs: bs, level: top, first: first, probe: local[1<<top-1]},
		marks: marks, local: local, seq: seq})
	return local, seq, reused
}

// tokenBytes is tokens' memory in the platform's byte order: the digests
// are compared only within this process.
func tokenBytes(t []kv.Token) []byte {
	if len(t) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&t[0])), 4*len(t))
}

func (m *hashMemo) get(k hashKey) *hashEntry {
	m.mu.Lock()
	defer m.mu.Unlock()
	el, ok := m.keys[k]
	if !ok {
		return nil
	}
	m.lru.MoveToFront(el)
	return el.Value.(*hashEntry)
}

// put keeps e (its hashes are the decision's too: neither modifies them).
func (m *hashMemo) put(e *hashEntry) {
	e.size = 16*len(e.local) + 24*len(e.marks) + 160
	if e.size > m.budget {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if el, ok := m.keys[e.key]; ok {
		m.drop(el)
	}
	m.keys[e.key] = m.lru.PushFront(e)
	m.held += e.size
	for m.held > m.budget {
		m.drop(m.lru.Back())
	}
}

func (m *hashMemo) drop(el *list.Element) {
	e := m.lru.Remove(el).(*hashEntry)
	delete(m.keys, e.key)
	m.held -= e.size
}
