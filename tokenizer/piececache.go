package tokenizer

import "hash/maphash"

// pieceCache remembers, within one Encode call, the tokens of pre-tokens
// that are not themselves a token (and so needed the merge loop): prose
// repeats its words, and a long prompt merges each such word once. It is
// per call, so nothing is shared between goroutines, and bounded: once
// full it stops adding. Keys are sub-slices of the text being encoded
// (no copies); they hash with the vocabulary's seed, whose hash of a
// piece longer than shortKeyBytes the whole-token lookup has already
// computed.
type pieceCache struct {
	slots []pieceSlot
	ids   []uint32
	used  int
}

// pieceSlot is one cached piece: its tokens are ids[off:off+n]; n == 0
// marks an empty slot (a piece has at least one token).
type pieceSlot struct {
	key    string
	tag    uint32
	off, n uint32
}

const (
	// pieceCacheSlots is the table's size; it takes at most half.
	pieceCacheSlots = 4096
	// pieceCacheAfter is how many merged pieces a call sees before it
	// makes a cache: a short prompt does not pay for the table.
	pieceCacheAfter = 32
	// pieceCacheMaxBytes: only pieces shorter than this are cached.
	pieceCacheMaxBytes = heapThreshold
)

func newPieceCache() *pieceCache {
	return &pieceCache{slots: make([]pieceSlot, pieceCacheSlots), ids: make([]uint32, 0, 4*pieceCacheSlots)}
}

// get is the tokens cached for piece (hash h), or nil.
func (c *pieceCache) get(piece string, h uint64) []uint32 {
	tag := uint32(h >> 32)
	for i := h & (pieceCacheSlots - 1); ; i = (i + 1) & (pieceCacheSlots - 1) {
		sl := &c.slots[i]
		if sl.n == 0 {
			return nil
		}
		if sl.tag == tag && sl.key == piece {
			return c.ids[sl.off : sl.off+sl.n]
		}
	}
}

// put caches piece's tokens (hash h) unless the table is half full; piece
// must not be cached already.
func (c *pieceCache) put(piece string, h uint64, ids []uint32) {
	if c.used >= pieceCacheSlots/2 || len(ids) == 0 {
		return
	}
	i := h & (pieceCacheSlots - 1)
	for c.slots[i].n != 0 {
		i = (i + 1) & (pieceCacheSlots - 1)
	}
	c.slots[i] = pieceSlot{key: piece, tag: uint32(h >> 32), off: uint32(len(c.ids)), n: uint32(len(ids))}
	c.ids = append(c.ids, ids...)
	c.used++
}

// hash is the vocabulary table's hash of s.
func (v *vocabTable) hash(s string) uint64 { return maphash.String(v.seed, s) }
