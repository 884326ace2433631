package router

import (
	"bytes"
	"container/list"
	"math/bits"
	"slices"
	"sync"
	"unsafe"

	"github.com/kvmesh/kvmesh/kv"
)

// hashMemo keeps recent prompts' block hashes, so that a prompt starting
// with an earlier prompt's blocks (a conversation's next turn resends the
// whole history) hashes and chains only its new blocks. What the memo
// gives is checked against the request's own tokens (a compare at memory
// speed, not a hash per block), so a hit returns exactly what hashing
// would: the first block that differs, and everything after it, is hashed
// afresh.
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

// hashEntry is one prompt's full blocks: their tokens (segments, the
// earlier ones shared with the entry it continued) and hashes.
type hashEntry struct {
	key   hashKey
	segs  [][]kv.Token // concatenated: the tokens of the len(local) full blocks
	local []kv.LocalHash
	seq   []kv.SeqHash
	size  int
}

const (
	// hashMemoMinBlocks: shorter prompts hash in well under a µs.
	hashMemoMinBlocks = 4
	// hashMemoBytes is the memo's budget (~4M tokens of prompts).
	hashMemoBytes = 16 << 20
)

func newHashMemo(budget int) *hashMemo {
	if budget <= 0 {
		return nil
	}
	return &hashMemo{budget: budget, keys: map[hashKey]*list.Element{}}
}

// hashes returns the local and sequence hashes of the n full blocks of
// tokens (bs tokens each, seed kv.Seed(LoRA, salt)), in one new
// allocation that the memo keeps too (neither modifies it); from an earlier prompt's entry as far as its tokens
// agree, and keeps them for a later one. reused is how many blocks came
// from the memo.
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
	if hit != nil {
		reused = hit.agree(tokens) / bs
		reused = min(reused, len(hit.local), n)
		local = append(local, hit.local[:reused]...)
		seq = append(seq, hit.seq[:reused]...)
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
	m.put(hit, reused, tokens[:n*bs], local, seq, hashKey{seed: seed, bs: bs, level: top, first: first, probe: local[1<<top-1]})
	return local, seq, reused
}

// agree is how many of tokens' first tokens equal e's.
func (e *hashEntry) agree(tokens []kv.Token) int {
	at := 0
	for _, s := range e.segs {
		t := tokens[at:min(len(tokens), at+len(s))]
		if !bytes.Equal(tokenBytes(t), tokenBytes(s[:len(t)])) {
			for i := range t {
				if t[i] != s[i] {
					return at + i
				}
			}
		}
		at += len(t)
		if len(t) < len(s) {
			break
		}
	}
	return at
}

// tokenBytes is tokens' memory: bytes.Equal compares it at memcmp speed
// (slices.Equal goes a token at a time, as slow as hashing it).
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

// put keeps a prompt's blocks (tokens, n full blocks of them) and hashes
// under k: its first reused blocks are prev's, whose token segments it
// shares; the rest of its tokens are copied (the request's slice is the
// caller's).
func (m *hashMemo) put(prev *hashEntry, reused int, tokens []kv.Token, local []kv.LocalHash, seq []kv.SeqHash, k hashKey) {
	bs := len(tokens) / len(local)
	e := &hashEntry{key: k, local: local, seq: seq}
	if reused > 0 {
		upto := reused * bs
		for _, s := range prev.segs {
			if upto == 0 {
				break
			}
			c := min(len(s), upto)
			e.segs = append(e.segs, s[:c:c])
			upto -= c
		}
	}
	e.segs = append(e.segs, slices.Clone(tokens[reused*bs:]))
	// Shared segments count in every entry that holds them: the budget
	// bounds what the memo can keep alive, not less.
	e.size = 4*len(tokens) + 16*len(local) + 24*len(e.segs) + 128
	if e.size > m.budget {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if el, ok := m.keys[k]; ok {
		m.drop(el)
	}
	m.keys[k] = m.lru.PushFront(e)
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
