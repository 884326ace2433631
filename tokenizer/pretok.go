package tokenizer

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// A splitter cuts text into pre-tokens; BPE then runs inside each piece
// only. yield receives each piece as a sub-slice of text (no copies) and
// returns false to stop the split (the prompt is already too long); split
// reports whether it ran to the end.
type splitter interface {
	split(text string, yield func(piece string) bool) bool
}

// Regex patterns of the common byte-level BPE families. They are matched by
// hand-written scanners (patternSplitter) because a backtracking regex engine
// costs several hundred ns per piece; the scanners are checked against
// regexp2 running the very same pattern in pretok_test.go.
const (
	// PatternO200k is tiktoken's o200k_base split pattern (GPT-4o).
	PatternO200k = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// PatternCl100k is tiktoken's cl100k_base pattern, also Llama-3's Split pattern.
	PatternCl100k = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// PatternQwen2 is Qwen2/Qwen3's Split pattern: cl100k with single digits.
	PatternQwen2 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// PatternGPT2 is the GPT-2 pattern HF's ByteLevel pre-tokenizer uses when use_regex is true.
	PatternGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

type patternKind int

const (
	kindO200k patternKind = iota
	kindCl100k
	kindQwen2
	kindGPT2
)

// knownPatterns maps a regex (as written in tiktoken or tokenizer.json) to
// its hand-written scanner. Llama-3's tokenizer.json spells \p{N}{1,3} and
// the rest identically to cl100k, so one entry covers both.
var knownPatterns = map[string]patternKind{
	PatternO200k:  kindO200k,
	PatternCl100k: kindCl100k,
	PatternQwen2:  kindQwen2,
	PatternGPT2:   kindGPT2,
}

// newSplitter returns the fast scanner for a known pattern and a regexp2
// splitter (Isolated behaviour: matches and the gaps between them are both
// pieces) for anything else.
func newSplitter(pattern string) (splitter, error) {
	if k, ok := knownPatterns[pattern]; ok {
		return patternSplitter{kind: k}, nil
	}
	re, err := regexp2.Compile(pattern, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: compile split pattern %q: %w", pattern, err)
	}
	return &regexSplitter{re: re}, nil
}

// regexSplitter is the general fallback. regexp2 works on runes; offsets are
// mapped back to bytes so pieces stay sub-slices of the input.
type regexSplitter struct{ re *regexp2.Regexp }

func (r *regexSplitter) split(text string, yield func(string) bool) bool {
	runes := []rune(text)
	// byteOff[i] is the byte offset of rune i; invalid bytes decode to one
	// RuneError rune of width 1, matching []rune's conversion.
	byteOff := make([]int, len(runes)+1)
	off := 0
	for i := range runes {
		byteOff[i] = off
		_, n := utf8.DecodeRuneInString(text[off:])
		off += n
	}
	byteOff[len(runes)] = len(text)
	last := 0
	m, err := r.re.FindRunesMatch(runes)
	for err == nil && m != nil {
		start, end := m.RuneIndex, m.RuneIndex+m.RuneLength
		if start > last && !yield(text[byteOff[last]:byteOff[start]]) {
			return false
		}
		if end > start && !yield(text[byteOff[start]:byteOff[end]]) {
			return false
		}
		last = end
		m, err = r.re.FindNextMatch(m)
	}
	// A regex error (only a timeout, which is never set) leaves the rest as one piece.
	if last < len(runes) {
		return yield(text[byteOff[last]:])
	}
	return true
}

// sequenceSplitter applies several splitters in turn, each to the pieces of
// the one before (HF's pre_tokenizer Sequence of Splits).
type sequenceSplitter []splitter

func (s sequenceSplitter) split(text string, yield func(string) bool) bool {
	var rec func(i int, t string) bool
	rec = func(i int, t string) bool {
		if i == len(s) {
			return yield(t)
		}
		return s[i].split(t, func(p string) bool { return rec(i+1, p) })
	}
	return rec(0, text)
}

// Character classes as bits, computed once per rune.
const (
	cL    uint8 = 1 << iota // \p{L}
	cN                      // \p{N}
	cM                      // \p{M}
	cS                      // \s (Go's unicode.IsSpace, which is what regexp2 uses)
	cCRLF                   // \r or \n
	cUp                     // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
	cLo                     // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
)

var asciiClass [128]uint8

// bmpClass is every class of the Basic Multilingual Plane (64 KiB): a
// CJK or accented letter costs a table read, not four searches of
// Unicode's range tables. It is filled from those tables range by range:
// classOfSlow rune by rune would cost every process's start-up far more.
var bmpClass [0x10000]uint8

func init() {
	for r := rune(0); r < 128; r++ {
		asciiClass[r] = classOfSlow(r)
	}
	fillBMPClass(&bmpClass)
}

// fillBMPClass sets the classes classOfSlow gives, from the range tables.
func fillBMPClass(t *[0x10000]uint8) {
	set := func(tab *unicode.RangeTable, c uint8) {
		for _, rg := range tab.R16 {
			for r := int(rg.Lo); r <= int(rg.Hi); r += int(rg.Stride) {
				t[r] |= c
			}
		}
	}
	set(unicode.L, cL)
	set(unicode.Lu, cUp)
	set(unicode.Lt, cUp)
	set(unicode.Lm, cUp|cLo)
	set(unicode.Lo, cUp|cLo)
	set(unicode.Ll, cLo)
	set(unicode.M, cM|cUp|cLo)
	set(unicode.N, cN)
	set(unicode.White_Space, cS) // unicode.IsSpace: White_Space, in Latin-1 too
	t['\r'] |= cCRLF
	t['\n'] |= cCRLF
}

func classOfSlow(r rune) uint8 {
	var c uint8
	if unicode.IsLetter(r) {
		c |= cL
		if unicode.In(r, unicode.Lu, unicode.Lt, unicode.Lm, unicode.Lo) {
			c |= cUp
		}
		if unicode.In(r, unicode.Ll, unicode.Lm, unicode.Lo) {
			c |= cLo
		}
	}
	if unicode.IsMark(r) {
		c |= cM | cUp | cLo
	}
	if unicode.IsNumber(r) {
		c |= cN
	}
	if unicode.IsSpace(r) {
		c |= cS
	}
	if r == '\r' || r == '\n' {
		c |= cCRLF
	}
	return c
}

// at decodes the rune at byte offset i: its class and width. Invalid bytes
// are width 1 with no class (they fall in the "other symbols" branch).
func at(s string, i int) (uint8, int) {
	b := s[i]
	if b < utf8.RuneSelf {
		return asciiClass[b], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	if r == utf8.RuneError && n == 1 {
		return 0, 1
	}
	if r < 0x10000 {
		return bmpClass[r], n
	}
	return classOfSlow(r), n
}

// patternSplitter scans one of the known patterns. Each alternative below
// reproduces the leftmost-first backtracking result of the regex.
type patternSplitter struct{ kind patternKind }

func (p patternSplitter) split(s string, yield func(string) bool) bool {
	for i := 0; i < len(s); {
		e := p.end(s, i)
		if !yield(s[i:e]) {
			return false
		}
		i = e
	}
	return true
}

// end is where the piece that starts at i ends.
func (p patternSplitter) end(s string, i int) int {
	var e int
	switch p.kind {
	case kindO200k:
		e = matchO200k(s, i)
	case kindCl100k:
		e = matchCl100k(s, i, 3)
	case kindQwen2:
		e = matchCl100k(s, i, 1)
	default:
		e = matchGPT2(s, i)
	}
	if e <= i { // unreachable: every character matches some branch
		_, n := at(s, i)
		e = i + n
	}
	return e
}

// contraction matches 's|'t|'re|'ve|'m|'ll|'d at i, case-insensitively when
// fold is set (then s also matches U+017F, as Unicode case folding says).
func contraction(s string, i int, fold bool) int {
	if i+1 >= len(s) || s[i] != '\'' {
		return i
	}
	lower := func(b byte) byte {
		if fold && b >= 'A' && b <= 'Z' {
			return b + 32
		}
		return b
	}
	c := lower(s[i+1])
	switch c {
	case 's', 't', 'm', 'd':
		return i + 2
	case 'r', 'v':
		if i+2 < len(s) && lower(s[i+2]) == 'e' {
			return i + 3
		}
	case 'l':
		if i+2 < len(s) && lower(s[i+2]) == 'l' {
			return i + 3
		}
	case 0xC5: // U+017F LATIN SMALL LETTER LONG S is C5 BF
		if fold && i+2 < len(s) && s[i+2] == 0xBF {
			return i + 3
		}
	}
	return i
}

// run returns the end of the longest run of runes from i whose class has any
// bit of want, and the number of runes in it (capped at max when max > 0).
func run(s string, i int, want uint8, max int) (int, int) {
	n := 0
	for i < len(s) && (max <= 0 || n < max) {
		c, w := at(s, i)
		if c&want == 0 {
			break
		}
		i += w
		n++
	}
	return i, n
}

// whitespace handles the three trailing alternatives shared by all patterns:
// \s*[\r\n]+ | \s+(?!\S) | \s+  (GPT-2 lacks the first; crlf=false).
func whitespace(s string, i int, crlf bool) int {
	c, w := at(s, i)
	if c&cS == 0 {
		return i
	}
	// Walk the whitespace run, remembering the end of the last \r/\n and
	// the start of the last rune.
	end, lastNL, lastStart := i, -1, i
	for end < len(s) {
		c, w = at(s, end)
		if c&cS == 0 {
			break
		}
		lastStart = end
		end += w
		if c&cCRLF != 0 {
			lastNL = end
		}
	}
	if crlf && lastNL >= 0 {
		return lastNL // \s*[\r\n]+: greedy \s* backs off to the last newline
	}
	if end == len(s) || lastStart == i {
		// \s+(?!\S) holds at end of text; a single rune before \S falls to \s+.
		return end
	}
	return lastStart // \s+(?!\S): leave the last space to prefix the next word
}

// punct matches ` ?[^\s\p{L}\p{N}]+` followed by trailing chars in tail
// (a class of \r \n and optionally '/').
func punct(s string, i int, slash, crlfTail bool) int {
	j := i
	if s[j] == ' ' {
		j++
	}
	e, n := i, 0
	for k := j; k < len(s); {
		c, w := at(s, k)
		if c&(cS|cL|cN) != 0 {
			break
		}
		k += w
		e, n = k, n+1
	}
	if n == 0 {
		return i
	}
	if crlfTail {
		for e < len(s) && (s[e] == '\r' || s[e] == '\n' || (slash && s[e] == '/')) {
			e++
		}
	}
	return e
}

func matchO200k(s string, i int) int {
	if e := o200kASCIIWord(s, i); e > i {
		return e
	}
	return matchO200kRest(s, i)
}

// matchO200kRest is matchO200k where o200kASCIIWord found no word.
func matchO200kRest(s string, i int) int {
	if o200kNoWordAt(s, i) {
		if b := s[i]; b-'0' < 10 {
			// \p{N}{1,3}: up to three ASCII digits, unless a
			// non-ASCII byte (maybe a number) follows fewer.
			e := i + 1
			for e < len(s) && e < i+3 && s[e]-'0' < 10 {
				e++
			}
			if e == i+3 || e == len(s) || s[e] < utf8.RuneSelf {
				return e
			}
			e, _ = run(s, i, cN, 3)
			return e
		} else if b == ' ' && i+1 < len(s) && s[i+1]-'0' < 10 {
			return i + 1 // a lone space before a number: \s+
		}
		if e := punct(s, i, true, true); e > i {
			return e
		}
		return whitespace(s, i, true)
	}
	// Alternatives 1 and 2, each first with the optional [^\r\n\p{L}\p{N}] prefix.
	c, w := at(s, i)
	prefix := c&(cL|cN|cCRLF) == 0
	for alt := 1; alt <= 2; alt++ {
		if prefix && i+w < len(s) {
			if e := o200kWord(s, i+w, alt); e > i+w {
				return e
			}
		}
		if e := o200kWord(s, i, alt); e > i {
			return e
		}
	}
	if c&cN != 0 {
		e, _ := run(s, i, cN, 3)
		return e
	}
	if e := punct(s, i, true, true); e > i {
		return e
	}
	return whitespace(s, i, true)
}

// o200kWord matches alternative 1 (U*L+) or 2 (U+L*) at i, plus the optional
// contraction; it returns i when the alternative fails.
func o200kWord(s string, i, alt int) int {
	// The maximal U run, and the end of its last rune that is in L too
	// (Lm, Lo, M are in both): where alternative 1's backtracking stops.
	k, lastLo := i, -1
	for k < len(s) {
		c, w := at(s, k)
		if c&cUp == 0 {
			break
		}
		k += w
		if c&cLo != 0 {
			lastLo = k
		}
	}
	var e int
	if alt == 2 {
		if k == i {
			return i
		}
		e, _ = run(s, k, cLo, 0)
	} else {
		// U* greedy; L+ must match at the first position backtracking reaches.
		if c, _ := at2(s, k); c&cLo != 0 {
			e, _ = run(s, k, cLo, 0)
		} else if lastLo >= 0 {
			e = lastLo
		} else {
			return i
		}
	}
	return contraction(s, e, true)
}

// at2 is at that tolerates the end of text (class 0).
func at2(s string, i int) (uint8, int) {
	if i >= len(s) {
		return 0, 0
	}
	return at(s, i)
}

func matchCl100k(s string, i int, digits int) int {
	if e := contraction(s, i, true); e > i {
		return e
	}
	c, w := at(s, i)
	if c&(cL|cN|cCRLF) == 0 && i+w < len(s) {
		if e, n := run(s, i+w, cL, 0); n > 0 {
			return e
		}
	}
	if c&cL != 0 {
		e, _ := run(s, i, cL, 0)
		return e
	}
	if c&cN != 0 {
		e, _ := run(s, i, cN, digits)
		return e
	}
	if e := punct(s, i, false, true); e > i {
		return e
	}
	return whitespace(s, i, true)
}

func matchGPT2(s string, i int) int {
	if e := contraction(s, i, false); e > i {
		return e
	}
	j := i
	if s[i] == ' ' && i+1 < len(s) {
		j = i + 1
	}
	for _, cls := range [2]uint8{cL, cN} {
		if e, n := run(s, j, cls, 0); n > 0 {
			return e
		}
	}
	if e := punct(s, i, false, false); e > i {
		return e
	}
	return whitespace(s, i, false)
}

// o200kASCIIWord is matchO200k's answer for the common ASCII word — an
// optional ASCII prefix (space, punctuation), [A-Z]*[a-z]* with at least one
// letter, then an ASCII byte or the end — without decoding runes; it returns
// i for anything else (the general scan decides). For such text both word
// alternatives end where the lowercase run ends: alternative 1 (with the
// prefix, tried first) matches when that run is non-empty, alternative 2
// otherwise. A non-ASCII byte after either run may be a letter or mark that
// extends it, so then this answers i.
func o200kASCIIWord(s string, i int) int {
	j := i
	if b := s[i]; b >= utf8.RuneSelf {
		return i
	} else if asciiClass[b]&(cL|cN|cCRLF) == 0 {
		j++ // the optional [^\r\n\p{L}\p{N}] prefix
	}
	k := j
	for k < len(s) && s[k]-'A' < 26 {
		k++
	}
	e := lowerRun(s, k)
	if e == len(s) {
		if e == j {
			return i
		}
		return e
	}
	if e == j || s[e] >= utf8.RuneSelf {
		return i
	}
	if s[e] == '\'' {
		return contraction(s, e, true)
	}
	return e
}

// o200kNoWordAt reports, from ASCII bytes alone, that neither word
// alternative matches at i: s[i] is an ASCII byte that is no letter, and
// it cannot be the optional prefix of a word either — it is a digit, \r or
// \n (no prefix), or the byte after it is ASCII and no letter. Digits,
// spaces and punctuation then skip the word scans.
func o200kNoWordAt(s string, i int) bool {
	b := s[i]
	if b >= utf8.RuneSelf || asciiClass[b]&cL != 0 {
		return false
	}
	if asciiClass[b]&(cN|cCRLF) != 0 || i+1 == len(s) {
		return true
	}
	n := s[i+1]
	return n < utf8.RuneSelf && asciiClass[n]&cL == 0
}

// lowerRun is the end of the run of ASCII lowercase letters from k. It
// tests eight bytes at a time: a byte is a-z when adding 0x80-'a' sets its
// high bit and adding 0x80-('z'+1) does not. A byte below 0x80 carries
// into no other; one from 0x80 on comes out no letter either way (both
// sums keep the high bit, or the first wraps below it), and its carry
// reaches only later bytes, after the run's end.
func lowerRun(s string, k int) int {
	const (
		ones = 0x0101010101010101
		high = 0x8080808080808080
	)
	for k+8 <= len(s) {
		x := binary.LittleEndian.Uint64([]byte(s[k : k+8]))
		lower := (x + ones*(0x80-'a')) &^ (x + ones*(0x80-'z'-1)) & high
		if lower == high {
			k += 8
			continue
		}
		return k + bits.TrailingZeros64(^lower&high)/8
	}
	for k < len(s) && s[k]-'a' < 26 {
		k++
	}
	return k
}
