package tokenizer

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// o200kVocabMap is o200k's mergeable vocabulary as a plain map, the
// reference the packed tables are checked against.
func o200kVocabMap(t testing.TB) (*BPE, map[string]uint32) {
	tok := builtinBPE(t)
	m := make(map[string]uint32, o200kMergeable)
	for id := uint32(0); id < o200kMergeable; id++ {
		m[tok.Piece(id)] = id
	}
	return tok, m
}

// checkVocabGet compares the table's answer for s with the map's.
func checkVocabGet(t testing.TB, v *vocabTable, m map[string]uint32, s string) {
	t.Helper()
	id, ok := v.get(s)
	wantID, wantOK := m[s]
	if ok != wantOK || id != wantID {
		t.Fatalf("get(%q) = %d, %v; want %d, %v", s, id, ok, wantID, wantOK)
	}
}

// TestVocabTableMatchesMap looks up every o200k token, and near misses of
// the short ones (a byte changed, dropped, or a zero byte added: keys are
// zero-padded, so "a" and "a\x00" must stay apart), against a map.
func TestVocabTableMatchesMap(t *testing.T) {
	tok, m := o200kVocabMap(t)
	r := rand.New(rand.NewPCG(21, 22))
	for s := range m {
		checkVocabGet(t, tok.vocab, m, s)
		if len(s) > shortKeyBytes+1 {
			continue
		}
		checkVocabGet(t, tok.vocab, m, s+"\x00")
		checkVocabGet(t, tok.vocab, m, "\x00"+s)
		checkVocabGet(t, tok.vocab, m, s[:len(s)-1])
		checkVocabGet(t, tok.vocab, m, s[1:])
		b := []byte(s)
		b[r.IntN(len(b))] ^= byte(1 << r.IntN(8))
		checkVocabGet(t, tok.vocab, m, string(b))
	}
	for range 200000 {
		b := make([]byte, 1+r.IntN(12))
		for k := range b {
			b[k] = " etaoinshrd\x00\xff0123456789"[r.IntN(22)]
		}
		checkVocabGet(t, tok.vocab, m, string(b))
	}
}

// TestVocabTableRepeatedKeys: a repeated key keeps its last id, short or
// long, as assigning to a map does; the empty key is left out.
func TestVocabTableRepeatedKeys(t *testing.T) {
	long := strings.Repeat("x", shortKeyBytes+3)
	v := newVocabTable([]vocabEntry{{"a", 1}, {"a\x00", 2}, {long, 3}, {"a", 4}, {long, 5}, {"", 6}, {"\x00", 7}})
	for s, want := range map[string]uint32{"a": 4, "a\x00": 2, long: 5, "\x00": 7} {
		if id, ok := v.get(s); !ok || id != want {
			t.Errorf("get(%q) = %d, %v; want %d", s, id, ok, want)
		}
	}
	for _, s := range []string{"", "\x00\x00", "a\x00\x00", long[1:]} {
		if id, ok := v.get(s); ok {
			t.Errorf("get(%q) = %d, want none", s, id)
		}
	}
}

// FuzzVocabTable checks any byte string's lookup against the map.
func FuzzVocabTable(f *testing.F) {
	for _, s := range []string{"a", " the", "\x00", "a\x00", "12345678", "123456789", " government", "\xff\xfe"} {
		f.Add(s)
	}
	tok, m := o200kVocabMap(f)
	f.Fuzz(func(t *testing.T, s string) {
		checkVocabGet(t, tok.vocab, m, s)
	})
}

// TestVocabTableShortLengths: keys that pack to the same integer (zero
// bytes, different lengths) stay apart; in tables this small the probes
// of one run through the slot of another.
func TestVocabTableShortLengths(t *testing.T) {
	for n := 1; n <= shortKeyBytes; n++ {
		v := newVocabTable([]vocabEntry{{strings.Repeat("\x00", n), uint32(n)}})
		for m := 1; m <= shortKeyBytes; m++ {
			id, ok := v.get(strings.Repeat("\x00", m))
			if ok != (m == n) || (ok && id != uint32(n)) {
				t.Errorf("table of %d zero bytes: get of %d = %d, %v", n, m, id, ok)
			}
		}
	}
}
