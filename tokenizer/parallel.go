package tokenizer

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// A long segment of plain text is split into pre-tokens at points the o200k
// scanner always cuts at, whatever comes before or after, and the chunks are
// encoded on their own goroutines: each chunk yields exactly the pieces the
// whole segment yields there, so the concatenation is the sequential
// encoding, bit for bit.
//
// The cut rule (safeCut): p is a cut when text[p-1] is an ASCII letter and
// text[p] is a space. Why the o200k scanner (matchO200k, no lookbehind)
// always ends a piece at such a p:
//   - the piece holding text[p-1] is a word (alternatives 1 and 2, their
//     contraction included): digits, punctuation and whitespace runs never
//     hold a letter, and the optional one-rune prefix of a word is no letter;
//   - a word cannot run on into a space: a space is neither in the U nor
//     the L class, nor the start of a contraction, and the optional prefix
//     only comes first. So that piece ends at p.
//
// and why each chunk alone yields the same pieces:
//   - every match only reads forward (no lookbehind), so the chunk after p
//     starts where the whole text's scan restarts, from the same bytes;
//   - the scan of a piece ending at or before p never reads past p, and at
//     p reads a space, which every test there (the word runs, at2, the
//     contraction, o200kASCIIWord's non-ASCII check) treats as it treats
//     the end of text: the run stops, no contraction, no L.
//
// An ASCII byte is never inside a multi-byte rune (continuation bytes are
// ≥ 0x80), so text[p-1] and text[p] are whole runes even in invalid UTF-8.
// The rule is proven for the o200k scanner only; other splitters keep the
// sequential path (parallelOK).

// parallelMinBytes is the shortest segment encoded in chunks: below it the
// goroutines' start and join cost more than they save (docs/benchmarks.md
// §9.13).
const parallelMinBytes = 32 << 10

// cutSearchBytes bounds the scan for a cut from each chunk's target start:
// past it the chunk is joined to its neighbour.
const cutSearchBytes = 4 << 10

// safeCut reports whether the o200k scanner always cuts text at p (0 < p < len).
func safeCut(text string, p int) bool {
	c := text[p-1] | 0x20 // ASCII letters to lower case
	return text[p] == ' ' && c >= 'a' && c <= 'z'
}

// parallelOK reports whether ordinary segments of t may be encoded in
// chunks: only the o200k scanner, with no normalizer or prefix space that
// would change the text between the cut and the split.
func (t *BPE) parallelOK() bool {
	ps, ok := t.split.(patternSplitter)
	return ok && ps.kind == kindO200k && t.normalize == nil && !t.addPrefixSpace
}

// chunkCuts returns the cut offsets for splitting text into at most n
// chunks of about equal length (empty: do not split).
func chunkCuts(text string, n int) []int {
	var cuts []int
	for k := 1; k < n; k++ {
		target := len(text) * k / n
		if len(cuts) > 0 && target <= cuts[len(cuts)-1] {
			target = cuts[len(cuts)-1] + 1
		}
		for p := max(target, 1); p < len(text) && p < target+cutSearchBytes; p++ {
			if safeCut(text, p) {
				cuts = append(cuts, p)
				break
			}
		}
	}
	return cuts
}

// parallelChunks is how many chunks encodeParallel would use for a segment
// of n bytes (≤ 1: encode it sequentially).
func parallelChunks(n int) int {
	if n < parallelMinBytes {
		return 1
	}
	return min(runtime.GOMAXPROCS(0), n/(parallelMinBytes/2))
}

// encodeParallel appends the tokens of text (a segment after ordinary's
// rewrites, holding no added tokens), cut into at most n chunks, to e.out
// as the sequential split would,
// and reports false when it declined (too short, one CPU, no cuts found).
// Under a token limit the chunks are joined while the total stays within
// it; the chunk that crosses it is encoded again by e itself, which then
// stops at the very piece the sequential encoder stops at.
func (e *encodeState) encodeParallel(text string, n int) bool {
	if n <= 1 {
		return false
	}
	cuts := chunkCuts(text, n)
	if len(cuts) == 0 {
		return false
	}
	bounds := make([]int, 0, len(cuts)+2)
	bounds = append(bounds, 0)
	bounds = append(bounds, cuts...)
	bounds = append(bounds, len(text))
	parts := make([][]uint32, len(bounds)-1)
	// Chunks are claimed in order by the caller and the helpers alike: when
	// the other cores are busy and a helper has not started yet, the caller
	// encodes its chunk too instead of waiting for it (the tail under load).
	var next atomic.Int32
	work := func() {
		for i := int(next.Add(1)) - 1; i < len(parts); i = int(next.Add(1)) - 1 {
			parts[i] = e.t.encodeChunk(text[bounds[i]:bounds[i+1]])
		}
	}
	var wg sync.WaitGroup
	for range len(parts) - 1 {
		wg.Go(work)
	}
	work()
	wg.Wait()
	for i, p := range parts {
		if e.max > 0 && len(e.out)+len(p) > e.max {
			e.t.split.split(text[bounds[i]:bounds[i+1]], e.yield)
			return true
		}
		e.out = append(e.out, p...)
	}
	return true
}

// encodeChunk is the sequential encoding of one chunk, with no limit.
func (t *BPE) encodeChunk(text string) []uint32 {
	c := &encodeState{t: t, out: make([]uint32, 0, len(text)/4+4)}
	c.yield = c.piece
	t.split.split(text, c.yield)
	return c.out
}
