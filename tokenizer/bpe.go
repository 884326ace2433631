package tokenizer

import (
	"math"
	"sort"
	"strings"
	"unicode/utf8"
)

// BPE is a byte-level byte-pair-encoding tokenizer: tiktoken encodings and
// Hugging Face byte-level BPE models (GPT-2, Llama-3, Qwen2 …) both end up
// here. Token contents are raw bytes, so any byte string is encodable and
// decoding never needs a byte-to-unicode table. A BPE is immutable after
// construction and safe for concurrent use.
type BPE struct {
	name string

	// pieces.at(id) is the raw bytes of token id; "" marks an unused id.
	pieces  pieceTable
	special []bool // id is a special added token

	// vocab maps raw bytes to id for all mergeable (non-added) tokens.
	vocab *vocabTable
	// merges (HF models) maps the pair (left<<32 | right) to
	// (rank<<32 | result id). Nil for tiktoken encodings, where the rank of
	// a merge is the id of the merged bytes (merging by vocab rank).
	merges map[uint64]uint64
	// wholeFirst: a pre-token that is itself a token is emitted as is
	// (tiktoken always; HF when the model sets ignore_merges).
	wholeFirst bool
	byteID     [256]uint32

	split          splitter
	addPrefixSpace bool
	normalize      func(string) string

	// added tokens, matched in text before pre-tokenization, grouped by
	// first byte and longest first (leftmost-longest matching).
	addedByFirst [256][]addedToken
	specialIDs   map[string]uint32
	// longest is the most bytes one token covers, specialFirst the bytes
	// a special token starts with (setAdded sets both).
	longest      int
	specialFirst string
	// addedByte is the one byte every added token starts with ("<" in
	// most vocabularies) when addedJump, so the scan for them can jump.
	addedByte byte
	addedJump bool
}

type addedToken struct {
	content string
	id      uint32
	special bool
}

var _ Tokenizer = (*BPE)(nil)

// Name returns the encoding's name (e.g. "o200k_base" or the HF file's model name).
func (t *BPE) Name() string { return t.name }

// VocabSize is one past the largest token id, added tokens included. Some
// ids below it may be unused; they decode to "".
func (t *BPE) VocabSize() int { return t.pieces.len() }

// Piece returns the raw bytes of token id ("" for ids outside the vocabulary
// or unused). It may be an incomplete UTF-8 sequence.
func (t *BPE) Piece(id uint32) string {
	if int64(id) >= int64(t.pieces.len()) {
		return ""
	}
	return t.pieces.at(id)
}

// IsSpecial reports whether id is a special added token (e.g. <|im_end|>).
func (t *BPE) IsSpecial(id uint32) bool {
	return int64(id) < int64(len(t.special)) && t.special[id]
}

// TokenID returns the id of a special or added token given its exact text.
func (t *BPE) TokenID(content string) (uint32, bool) {
	id, ok := t.specialIDs[content]
	return id, ok
}

// Decode concatenates the raw bytes of the tokens. Ids outside the vocabulary
// (or unused ids) contribute nothing: an engine emitting arbitrary ids must
// never crash the frontend. Special tokens are included; the result may end
// in (or contain) invalid UTF-8 when the ids cut a character — use Decoder
// for streaming.
func (t *BPE) Decode(ids []uint32) string {
	n := 0
	for _, id := range ids {
		n += len(t.Piece(id))
	}
	var b strings.Builder
	b.Grow(n)
	for _, id := range ids {
		b.WriteString(t.Piece(id))
	}
	return b.String()
}

// Encode tokenizes text as plain text: special tokens written in the text are
// not recognised (they are encoded as ordinary bytes), so user content cannot
// inject control tokens. Non-special added tokens are recognised, as Hugging
// Face tokenizers do.
func (t *BPE) Encode(text string) []uint32 {
	ids, _ := t.EncodeUpTo(text, false, 0)
	return ids
}

// EncodeWithSpecial tokenizes text in which special tokens written literally
// (e.g. "<|im_start|>" from a rendered chat template) become their ids,
// except those Defuse marked.
func (t *BPE) EncodeWithSpecial(text string) []uint32 {
	ids, _ := t.EncodeUpTo(text, true, 0)
	return ids
}

// EncodeUpTo is Encode (special false) or EncodeWithSpecial (special true)
// that stops once the text has yielded more than max tokens (max ≤ 0: no
// limit): a prompt past the context limit costs the work of max tokens,
// not of its whole length. done is false when it stopped; ids then hold
// the tokens of the text's start read so far (none when its length alone
// told).
func (t *BPE) EncodeUpTo(text string, special bool, max int) (ids []uint32, done bool) {
	return t.encodeMarked(text, special, max, nil)
}

// encodeMarked is EncodeUpTo that calls mark (nil: none) at every added
// token it matches, with the token's offset in text and the number of
// tokens before it: the places where text may be cut and each side encoded
// alone (segments between added tokens are encoded independently).
func (t *BPE) encodeMarked(text string, special bool, max int, mark func(at, tokens int)) (ids []uint32, done bool) {
	// One state per call, not per segment: the splitter's callback escapes,
	// so whatever it captures is a heap allocation each time it is made.
	capacity := len(text)/4 + 4
	if max > 0 {
		capacity = min(capacity, max+maxPieceBytes)
	}
	if max > 0 && t.surelyOver(text, max) {
		return nil, false
	}
	e := &encodeState{t: t, out: make([]uint32, 0, capacity), max: max}
	e.yield = e.piece
	seg := 0
	for i := 0; i < len(text) && !e.full(); {
		if i = t.nextAdded(text, i); i == len(text) {
			break
		}
		a, ok := t.addedAt(text, i, special)
		if !ok {
			i++
			continue
		}
		e.ordinary(text[seg:i], special)
		if e.full() {
			return e.out, false
		}
		if mark != nil {
			mark(i, len(e.out))
		}
		e.out = append(e.out, a.id)
		i += len(a.content)
		seg = i
	}
	if !e.full() {
		e.ordinary(text[seg:], special)
	}
	return e.out, !e.full()
}

// nextAdded is the first offset from i where an added token may start
// (len(text): none).
func (t *BPE) nextAdded(text string, i int) int {
	if !t.addedJump {
		return i
	}
	if j := strings.IndexByte(text[i:], t.addedByte); j >= 0 {
		return i + j
	}
	return len(text)
}

// addedAt is the added token the encoder matches at text[i:] (leftmost
// longest; special ones only in special mode).
func (t *BPE) addedAt(text string, i int, special bool) (addedToken, bool) {
	for _, a := range t.addedByFirst[text[i]] {
		if (special || !a.special) && strings.HasPrefix(text[i:], a.content) {
			return a, true
		}
	}
	return addedToken{}, false
}

// surelyOver reports, from its length alone, that text yields more than max
// tokens. A huge prompt is refused without even being split.
func (t *BPE) surelyOver(text string, max int) bool {
	return t.lengthOver(len(text)-strings.Count(text, "\xff"), max) // Defuse's marks are no text
}

// lengthOver reports that any text of n bytes yields more than max tokens:
// no token covers more than t.longest bytes, and NFC shrinks text at most
// threefold (Hangul jamo to a syllable).
func (t *BPE) lengthOver(n, max int) bool {
	if t.longest <= 0 || max <= 0 {
		return false
	}
	if t.normalize != nil {
		n /= 3
	}
	return n/t.longest > max
}

// defuseMark follows the first byte of a special token's text that came
// from a user (Defuse): no valid UTF-8 holds it, so it cannot come from
// JSON text, and the special-token matcher then reads plain text there.
const defuseMark = 0xFF

// Defuse returns s with every special token written in it marked so that
// EncodeWithSpecial reads it as plain text: user text (a chat message's
// content, name …) goes through Defuse before the template renders it, and
// only the template's own text yields control tokens. Invalid UTF-8 becomes
// U+FFFD first, so no mark is forged.
func (t *BPE) Defuse(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	var b []byte
	last := 0
	for i := 0; i < len(s); {
		// Jump to the next byte a special token starts with ("<" mostly).
		next := strings.IndexAny(s[i:], t.specialFirst)
		if next < 0 {
			break
		}
		i += next
		a, ok := t.specialAt(s, i)
		if !ok {
			i++
			continue
		}
		if b == nil {
			b = make([]byte, 0, len(s)+8)
		}
		b = append(b, s[last:i+1]...)
		b = append(b, defuseMark)
		last = i + 1
		i += len(a.content)
	}
	if b == nil {
		return s
	}
	return string(append(b, s[last:]...))
}

// specialAt is the special token written at s[i:], longest first, as the
// encoder matches them.
func (t *BPE) specialAt(s string, i int) (addedToken, bool) {
	for _, a := range t.addedByFirst[s[i]] {
		if a.special && strings.HasPrefix(s[i:], a.content) {
			return a, true
		}
	}
	return addedToken{}, false
}

// encodeState is one Encode call's output and merge buffers.
type encodeState struct {
	t       *BPE
	out     []uint32
	max     int // stop past this many tokens; ≤ 0: never
	scratch mergeScratch
	yield   func(piece string) bool // e.piece, bound once
	// cache holds the tokens of merged pieces once merged counts
	// pieceCacheAfter of them (nil before).
	cache  *pieceCache
	merged int
}

// full reports whether the output is past the limit.
func (e *encodeState) full() bool { return e.max > 0 && len(e.out) > e.max }

// ordinary appends the tokens of a text segment that holds no added tokens
// (in special mode, the marks Defuse left are dropped first).
func (e *encodeState) ordinary(text string, special bool) {
	if special && strings.IndexByte(text, defuseMark) >= 0 {
		text = strings.ReplaceAll(text, "\xff", "")
	}
	if text == "" {
		return
	}
	t := e.t
	if t.normalize != nil {
		text = t.normalize(text)
	}
	if t.addPrefixSpace && text[0] != ' ' {
		text = " " + text
	}
	if p, ok := t.split.(patternSplitter); ok {
		e.splitPattern(p, text)
		return
	}
	t.split.split(text, e.yield)
}

// splitPattern is ordinary's split by a known pattern, its loop here so
// that each piece is a direct call, not one through the yield closure, and
// the common piece — a whole token of a few bytes, an ASCII word for
// o200k — takes the shortest way.
func (e *encodeState) splitPattern(p patternSplitter, text string) {
	t := e.t
	for i := 0; i < len(text); {
		var end int
		if p.kind == kindO200k {
			if end = o200kASCIIWord(text, i); end <= i {
				end = matchO200kRest(text, i)
			}
		} else {
			end = p.end(text, i)
		}
		if end <= i { // unreachable, as in end
			_, n := at(text, i)
			end = i + n
		}
		start, piece := i, text[i:end]
		i = end
		if t.wholeFirst && len(piece) <= shortKeyBytes {
			if id, ok := t.vocab.getPacked(packAt(text, start, len(piece)), len(piece)); ok {
				e.out = append(e.out, id)
			} else {
				e.mergeParts(piece, 0, false)
			}
			if e.full() {
				return
			}
			continue
		}
		if !e.piece(piece) {
			return
		}
	}
}

// maxPieceBytes bounds the pre-token BPE merges at once: a longer one (a
// megabyte of one letter, which no split pattern cuts) is merged in chunks
// of this many bytes, cut at character boundaries, so its cost and scratch
// memory stay those of a chunk and the token limit is checked between
// chunks. Text has no pieces this long; where it does the tokens may
// differ from an unchunked merge at the chunk borders.
const maxPieceBytes = 1024

func (e *encodeState) piece(piece string) bool {
	for len(piece) > maxPieceBytes && !e.full() {
		cut := maxPieceBytes
		for cut > maxPieceBytes-utf8.UTFMax && !utf8.RuneStart(piece[cut]) {
			cut--
		}
		e.merge(piece[:cut])
		piece = piece[cut:]
	}
	if !e.full() {
		e.merge(piece)
	}
	return !e.full()
}

func (e *encodeState) merge(piece string) {
	t := e.t
	if len(piece) == 1 {
		// Every byte is a token of its own (byteID): no lookup needed.
		e.out = append(e.out, t.byteID[piece[0]])
		return
	}
	var h uint64
	hashed := false
	if t.wholeFirst {
		var id uint32
		var ok bool
		if len(piece) <= shortKeyBytes {
			id, ok = t.vocab.getShort(piece)
		} else {
			h, hashed = t.vocab.hash(piece), true
			id, ok = t.vocab.getLong(piece, h)
		}
		if ok {
			e.out = append(e.out, id)
			return
		}
	}
	e.mergeParts(piece, h, hashed)
}

// mergeParts appends the tokens of a piece that is not a whole token (or
// need not be one: !wholeFirst) by merging its bytes, through the call's
// piece cache; h is the piece's vocab hash when hashed.
func (e *encodeState) mergeParts(piece string, h uint64, hashed bool) {
	t := e.t
	if len(piece) >= pieceCacheMaxBytes {
		e.out = t.bytePairMerge(e.out, piece, &e.scratch)
		return
	}
	if e.cache == nil {
		if e.merged++; e.merged < pieceCacheAfter {
			e.out = t.bytePairMerge(e.out, piece, &e.scratch)
			return
		}
		e.cache = newPieceCache()
	}
	if !hashed {
		h = t.vocab.hash(piece)
	}
	if ids := e.cache.get(piece, h); ids != nil {
		e.out = append(e.out, ids...)
		return
	}
	n := len(e.out)
	e.out = t.bytePairMerge(e.out, piece, &e.scratch)
	e.cache.put(piece, h, e.out[n:])
}

// noRank marks a part that cannot merge with its right neighbour.
const noRank = math.MaxUint32

// mergeScratch holds reusable buffers for bytePairMerge within one Encode call.
type mergeScratch struct {
	start []int32
	id    []uint32
	rank  []uint32
	heap  mergeHeap
	next  []int32
	prev  []int32
}

// pairRank returns the rank of merging the adjacent parts [a, mid) and
// [mid, b) of piece with ids ia and ib, and the id of the result.
func (t *BPE) pairRank(piece string, a, b int, ia, ib uint32) (uint32, uint32) {
	if t.merges == nil {
		if id, ok := t.vocab.get(piece[a:b]); ok {
			return id, id
		}
		return noRank, 0
	}
	if v, ok := t.merges[uint64(ia)<<32|uint64(ib)]; ok {
		return uint32(v >> 32), uint32(v)
	}
	return noRank, 0
}

// heapThreshold: pieces this long merge with a heap (O(n log n)) instead of
// the quadratic scan, so a megabyte of one repeated letter stays cheap.
const heapThreshold = 64

// bytePairMerge appends the BPE tokens of one pre-token: repeatedly merge
// the adjacent pair with the lowest rank, leftmost first.
func (t *BPE) bytePairMerge(out []uint32, piece string, s *mergeScratch) []uint32 {
	if len(piece) >= heapThreshold {
		return t.bytePairMergeHeap(out, piece, s)
	}
	return t.bytePairMergeScan(out, piece, s)
}

// bytePairMergeScan finds each merge by a linear scan: fastest for the
// short pieces that make up almost all text.
func (t *BPE) bytePairMergeScan(out []uint32, piece string, s *mergeScratch) []uint32 {
	n := len(piece)
	s.start = s.start[:0]
	s.id = s.id[:0]
	s.rank = s.rank[:0]
	for i := 0; i < n; i++ {
		s.start = append(s.start, int32(i))
		s.id = append(s.id, t.byteID[piece[i]])
	}
	s.start = append(s.start, int32(n))
	end := func(k int) int { return int(s.start[k+1]) }
	for k := 0; k < n-1; k++ {
		r, _ := t.pairRank(piece, k, k+2, s.id[k], s.id[k+1])
		s.rank = append(s.rank, r)
	}
	s.rank = append(s.rank, noRank)
	for len(s.id) > 1 {
		best, bestRank := -1, uint32(noRank)
		for k, r := range s.rank[:len(s.id)-1] {
			if r < bestRank {
				best, bestRank = k, r
			}
		}
		if best < 0 {
			break
		}
		_, merged := t.pairRank(piece, int(s.start[best]), end(best+1), s.id[best], s.id[best+1])
		s.id[best] = merged
		s.id = append(s.id[:best+1], s.id[best+2:]...)
		s.start = append(s.start[:best+1], s.start[best+2:]...)
		s.rank = append(s.rank[:best+1], s.rank[best+2:]...)
		if best+1 < len(s.id) {
			s.rank[best], _ = t.pairRank(piece, int(s.start[best]), end(best+1), s.id[best], s.id[best+1])
		} else {
			s.rank[best] = noRank
		}
		if best > 0 {
			s.rank[best-1], _ = t.pairRank(piece, int(s.start[best-1]), end(best), s.id[best-1], s.id[best])
		}
	}
	return append(out, s.id...)
}

type mergeCand struct {
	rank uint32
	pos  int32
}

// mergeHeap is a typed binary min-heap ordered by (rank, pos).
type mergeHeap []mergeCand

func (h mergeHeap) less(a, b int) bool {
	if h[a].rank != h[b].rank {
		return h[a].rank < h[b].rank
	}
	return h[a].pos < h[b].pos
}

func (h *mergeHeap) push(c mergeCand) {
	*h = append(*h, c)
	x := *h
	for i := len(x) - 1; i > 0; {
		p := (i - 1) / 2
		if !x.less(i, p) {
			break
		}
		x[i], x[p] = x[p], x[i]
		i = p
	}
}

func (h *mergeHeap) pop() mergeCand {
	x := *h
	top := x[0]
	last := len(x) - 1
	x[0] = x[last]
	x = x[:last]
	for i := 0; ; {
		c := 2*i + 1
		if c >= len(x) {
			break
		}
		if c+1 < len(x) && x.less(c+1, c) {
			c++
		}
		if !x.less(c, i) {
			break
		}
		x[i], x[c] = x[c], x[i]
		i = c
	}
	*h = x
	return top
}

// bytePairMergeHeap is bytePairMerge on a doubly linked list of parts with a
// heap of candidate merges; stale candidates are skipped by comparing ranks
// (a rank names one merge, so an equal rank at the same position is the same
// merge).
func (t *BPE) bytePairMergeHeap(out []uint32, piece string, s *mergeScratch) []uint32 {
	n := len(piece)
	s.id = s.id[:0]
	s.rank = s.rank[:0]
	s.next = s.next[:0]
	s.prev = s.prev[:0]
	s.heap = s.heap[:0]
	for i := 0; i < n; i++ {
		s.id = append(s.id, t.byteID[piece[i]])
		s.rank = append(s.rank, noRank)
		s.next = append(s.next, int32(i+1))
		s.prev = append(s.prev, int32(i-1))
	}
	s.next[n-1] = -1
	// endOf is the byte end of the part starting at i.
	endOf := func(i int32) int {
		if nx := s.next[i]; nx >= 0 {
			return int(nx)
		}
		return n
	}
	rankAt := func(i int32) uint32 {
		j := s.next[i]
		if j < 0 {
			return noRank
		}
		r, _ := t.pairRank(piece, int(i), endOf(j), s.id[i], s.id[j])
		return r
	}
	for i := int32(0); i < int32(n); i++ {
		if r := rankAt(i); r != noRank {
			s.rank[i] = r
			s.heap = append(s.heap, mergeCand{r, i})
		}
	}
	sort.Slice(s.heap, func(a, b int) bool { return s.heap.less(a, b) })
	for len(s.heap) > 0 {
		c := s.heap.pop()
		i := c.pos
		if s.rank[i] != c.rank {
			continue
		}
		j := s.next[i]
		_, merged := t.pairRank(piece, int(i), endOf(j), s.id[i], s.id[j])
		s.id[i] = merged
		k := s.next[j]
		s.next[i] = k
		if k >= 0 {
			s.prev[k] = i
		}
		s.rank[j] = noRank
		for _, b := range [2]int32{i, s.prev[i]} {
			if b < 0 {
				continue
			}
			s.rank[b] = rankAt(b)
			if s.rank[b] != noRank {
				s.heap.push(mergeCand{s.rank[b], b})
			}
		}
	}
	for i := int32(0); i >= 0; i = s.next[i] {
		out = append(out, s.id[i])
	}
	return out
}

// setAdded installs the added tokens (special or not) for text matching.
func (t *BPE) setAdded(tokens []addedToken) {
	for id := range t.pieces.len() {
		t.longest = max(t.longest, len(t.pieces.at(uint32(id))))
	}
	t.specialIDs = make(map[string]uint32, len(tokens))
	for i := range t.addedByFirst {
		t.addedByFirst[i] = nil
	}
	for _, a := range tokens {
		if a.content == "" {
			continue
		}
		t.specialIDs[a.content] = a.id
		f := a.content[0]
		if a.special && strings.IndexByte(t.specialFirst, f) < 0 {
			t.specialFirst += string(rune(f))
		}
		t.addedByFirst[f] = append(t.addedByFirst[f], a)
	}
	firsts := 0
	for i, l := range t.addedByFirst {
		if len(l) > 0 {
			firsts++
			t.addedByte = byte(i)
		}
	}
	t.addedJump = firsts == 1
	for i := range t.addedByFirst {
		l := t.addedByFirst[i]
		sort.SliceStable(l, func(a, b int) bool { return len(l[a].content) > len(l[b].content) })
	}
}

// bytePairMergeScanForTest forces the quadratic path regardless of length.
func (t *BPE) bytePairMergeScanForTest(piece string) []uint32 {
	var s mergeScratch
	return t.bytePairMergeScan(nil, piece, &s)
}
