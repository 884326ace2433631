package twin

import (
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/tracefile"
)

// promptHasher gives a trace request's full-block local hashes and its
// partial tail without materialising the prompt: when engine blocks tile
// trace blocks (the trace block size is a multiple of the engine's), an
// engine block's tokens depend only on its hash id and offset, so each hash
// id's blocks are hashed once per workload (Workload keeps the hasher
// between runs) and a repeated prefix costs a map
// lookup per trace block. The hashes equal kv.LocalHashes over
// appendTokens' expansion with the twin's (empty LoRA/salt) seed.
type promptHasher struct {
	tbs, bs, per int // per: engine blocks per trace block
	seed         uint64
	// Where a hash id's per hashes start in hs: by id (plus one; 0 is
	// unseen) for small ids, which traces number densely from 0 (a slice
	// stays in cache where a map of 10^5 ids does not), else in at.
	dense []int32
	at    map[uint64]int32
	// The hashes, in chunks of 1<<cbits that never move: position j is
	// chunk j>>cbits, offset j&(1<<cbits-1), and a hash id's per hashes
	// never straddle two chunks. (One slice grown by append spent more
	// time copying and faulting in fresh memory than hashing.)
	hs    [][]kv.LocalHash
	cbits uint
	n     int        // hashes stored
	tok   []kv.Token // one trace block's tokens
}

// hsChunkBits is the least chunk size of promptHasher.hs, in bits
// (64k hashes: 512 KiB).
const hsChunkBits = 16

// newPromptHasher returns nil when engine blocks straddle trace blocks.
func newPromptHasher(tbs, bs int) *promptHasher {
	if tbs <= 0 || bs <= 0 || tbs%bs != 0 {
		return nil
	}
	p := &promptHasher{tbs: tbs, bs: bs, per: tbs / bs, seed: kv.Seed("", ""), at: map[uint64]int32{}, cbits: hsChunkBits}
	for 1<<p.cbits < p.per {
		p.cbits++
	}
	return p
}

// blocksOf returns the local hashes of hash id's per engine blocks.
func (p *promptHasher) blocksOf(id uint64) []kv.LocalHash {
	if id < denseIDs {
		if id >= uint64(len(p.dense)) {
			p.dense = append(p.dense, make([]int32, max(int(id)+1-len(p.dense), len(p.dense)))...)
		}
		if j := p.dense[id]; j > 0 {
			return p.hashesAt(j - 1)
		}
		j := p.hash(id)
		p.dense[id] = j + 1
		return p.hashesAt(j)
	}
	j, ok := p.at[id]
	if !ok {
		j = p.hash(id)
		p.at[id] = j
	}
	return p.hashesAt(j)
}

// hashesAt returns the per hashes from position j.
func (p *promptHasher) hashesAt(j int32) []kv.LocalHash {
	off := int(j) & (1<<p.cbits - 1)
	return p.hs[j>>p.cbits][off : off+p.per : off+p.per]
}

// denseIDs bounds the ids indexed by slice (4 bytes each).
const denseIDs = 1 << 22

// hash appends id's block hashes to hs and returns where they start.
func (p *promptHasher) hash(id uint64) int32 {
	k := len(p.hs) - 1
	if k < 0 || len(p.hs[k])+p.per > 1<<p.cbits {
		p.hs = append(p.hs, make([]kv.LocalHash, 0, 1<<p.cbits))
		k++
	}
	c := p.hs[k]
	j := int32(k<<p.cbits | len(c))
	p.tok = appendTraceBlock(p.tok[:0], id, p.tbs)
	p.hs[k] = kv.LocalHashes(c, p.tok, p.bs, p.seed)
	p.n += p.per
	return j
}

// local returns a new slice of the full-block local hashes of rq's first
// plen tokens (plen ≤ tracefile.TokenLen).
func (p *promptHasher) local(rq *tracefile.Request, plen int) []kv.LocalHash {
	out := make([]kv.LocalHash, plen/p.bs)
	for i := 0; i*p.per < len(out); i++ {
		copy(out[i*p.per:], p.blocksOf(rq.HashIDs[i]))
	}
	return out
}

// appendTail appends rq's tokens [from, plen) to dst, where from is an
// engine block boundary and plen−from < the engine block size, so they lie
// in one trace block.
func (p *promptHasher) appendTail(dst []kv.Token, rq *tracefile.Request, from, plen int) []kv.Token {
	if from >= plen {
		return dst
	}
	i := from / p.tbs
	lo, hi := blockKey(rq.HashIDs[i])
	for j := from - i*p.tbs; j < plen-i*p.tbs; j++ {
		dst = append(dst, blockToken(lo, hi, j))
	}
	return dst
}
