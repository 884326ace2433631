package kv

import (
	"encoding/binary"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// Token is one token id. Engines and the router agree on u32. It stays an
// alias: a token id is not a hash domain, and tokenizers, traces and engines
// all hand over plain []uint32 that must not be copied to change type.
type Token = uint32

// BaseSeed is the XXH3 seed of every block hash (Dynamo-compatible).
const BaseSeed uint64 = 1337

// LocalHash identifies one block of tokens on its own, independent of what
// precedes it. The index navigates by it because the router can always
// recompute it from token ids.
type LocalHash uint64

// SeqHash identifies a block together with every block before it.
type SeqHash uint64

// EngineHash is the opaque hash an engine reports for a block in its KV
// events (vLLM's own block hash, the sim's sequence hash). Only the engine
// that reported it can interpret it: it resolves removes and parents, and a
// hint names the source engine's blocks by it. It is its own type so that a
// value of one hash domain cannot be passed where another is meant.
type EngineHash uint64

// Seed returns the local-hash seed for a request: BaseSeed plus
// xxh3(lora, seed 0) plus xxh3(salt, seed 1), all wrapping. Empty strings
// count as absent, so lora="" shares cache with no LoRA at all.
func Seed(lora, salt string) uint64 {
	s := BaseSeed
	if lora != "" {
		s += xxh3.HashStringSeed(lora, 0)
	}
	if salt != "" {
		s += xxh3.HashStringSeed(salt, 1)
	}
	return s
}

// littleEndian is true on every platform Go ships for servers; there a
// []uint32 already has the wire layout of the hash input and needs no copy.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// HashTokens is the local hash of one block: XXH3-64 over the tokens as
// u32 little-endian, with the given seed.
func HashTokens(tokens []Token, seed uint64) LocalHash {
	if len(tokens) == 0 {
		return LocalHash(xxh3.HashSeed(nil, seed))
	}
	if littleEndian {
		b := unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), len(tokens)*4)
		return LocalHash(xxh3.HashSeed(b, seed))
	}
	b := make([]byte, len(tokens)*4)
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(b[i*4:], t)
	}
	return LocalHash(xxh3.HashSeed(b, seed))
}

// ChainHash is the sequence hash of a block given its parent's sequence
// hash: XXH3-64(LE(parent) ‖ LE(local)), seed 1337.
func ChainHash(parent SeqHash, local LocalHash) SeqHash {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], uint64(parent))
	binary.LittleEndian.PutUint64(b[8:], uint64(local))
	return SeqHash(xxh3.HashSeed(b[:], BaseSeed))
}

// NumFullBlocks is how many complete blocks of blockSize fit in n tokens;
// the partial tail is never hashed.
func NumFullBlocks(n, blockSize int) int {
	if blockSize <= 0 {
		return 0
	}
	return n / blockSize
}

// BlocksNeeded is the KV capacity n tokens occupy: the tail rounds up.
func BlocksNeeded(n, blockSize int) int {
	if blockSize <= 0 {
		return 0
	}
	return (n + blockSize - 1) / blockSize
}

// LocalHashes appends the local hash of every full block of tokens to dst.
func LocalHashes(dst []LocalHash, tokens []Token, blockSize int, seed uint64) []LocalHash {
	n := NumFullBlocks(len(tokens), blockSize)
	for i := 0; i < n; i++ {
		dst = append(dst, HashTokens(tokens[i*blockSize:(i+1)*blockSize], seed))
	}
	return dst
}

// AppendSeqHashes appends to seq, the sequence hashes of a prompt's first
// blocks, those of the blocks after them, whose local hashes are local.
func AppendSeqHashes(seq []SeqHash, local []LocalHash) []SeqHash {
	if len(seq) == 0 {
		return SeqHashes(seq, local)
	}
	prev := seq[len(seq)-1]
	for _, l := range local {
		prev = ChainHash(prev, l)
		seq = append(seq, prev)
	}
	return seq
}

// SeqHashes appends the chained sequence hashes of local to dst:
// seq[0] = local[0], seq[i] = ChainHash(seq[i-1], local[i]).
func SeqHashes(dst []SeqHash, local []LocalHash) []SeqHash {
	var prev SeqHash
	for i, l := range local {
		if i == 0 {
			prev = SeqHash(l) // the first block has no parent: its sequence hash is its local hash
		} else {
			prev = ChainHash(prev, l)
		}
		dst = append(dst, prev)
	}
	return dst
}

// Hasher hashes token sequences for one block size and request identity.
type Hasher struct {
	BlockSize int
	Seed      uint64
}

// NewHasher returns a Hasher for blockSize with the LoRA/salt seed mixed in.
func NewHasher(blockSize int, lora, salt string) Hasher {
	return Hasher{BlockSize: blockSize, Seed: Seed(lora, salt)}
}

// Local returns the local hashes of every full block of tokens.
func (h Hasher) Local(tokens []Token) []LocalHash {
	return LocalHashes(make([]LocalHash, 0, NumFullBlocks(len(tokens), h.BlockSize)), tokens, h.BlockSize, h.Seed)
}

// Blocks returns both the local and the sequence hashes of every full block.
func (h Hasher) Blocks(tokens []Token) (local []LocalHash, seq []SeqHash) {
	local = h.Local(tokens)
	return local, SeqHashes(make([]SeqHash, 0, len(local)), local)
}

// RawHashes views a slice of hashes of one domain as the wire's []uint64,
// without copying: the two share memory. Use it only at a wire or table
// edge, where the domain is known from context.
func RawHashes[H ~uint64](hs []H) []uint64 {
	return unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(hs))), cap(hs))[:len(hs)]
}

// AsHashes views wire uint64s as hashes of domain H, without copying: the
// two share memory. The caller names the domain the wire carries.
func AsHashes[H ~uint64](raw []uint64) []H {
	return unsafe.Slice((*H)(unsafe.Pointer(unsafe.SliceData(raw))), cap(raw))[:len(raw)]
}
