package tokenizer

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestDecoderSplitCharacters(t *testing.T) {
	tok := builtinBPE(t)
	text := "Hi 😀👍🏽🇯🇵 — 分布式推理 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ok"
	ids := tok.Encode(text)
	partial := 0
	for _, id := range ids {
		if !utf8.ValidString(tok.Piece(id)) {
			partial++
		}
	}
	if partial == 0 {
		t.Fatalf("test text has no token that splits a character: %v", ids)
	}
	d := NewDecoder(tok, false)
	var out strings.Builder
	for _, id := range ids {
		s := d.Add(id)
		if !utf8.ValidString(s) {
			t.Fatalf("Add emitted invalid UTF-8 %q", s)
		}
		out.WriteString(s)
	}
	out.WriteString(d.Flush())
	if out.String() != text {
		t.Fatalf("streamed %q, want %q", out.String(), text)
	}
}

func TestDecoderInvalidAndSpecial(t *testing.T) {
	tok := loadTiny(t, "tokenizer.json") // ids 0-255 are single bytes
	cases := []struct {
		ids  []uint32
		want string
	}{
		{[]uint32{0xE4, 0xB8, 0xAD}, "中"},
		{[]uint32{0xE4, 0xB8}, "\uFFFD"},                   // truncated at the end: one U+FFFD on Flush
		{[]uint32{0xE4, 'a'}, "\uFFFDa"},                   // lead byte followed by ASCII
		{[]uint32{0x80, 0x80}, "\uFFFD\uFFFD"},             // stray continuation bytes
		{[]uint32{0xF0, 0x9F, 0x98}, "\uFFFD"},             // 3 of 4 bytes of 😀
		{[]uint32{0xED, 0xA0, 0x80}, "\uFFFD\uFFFD\uFFFD"}, // surrogate: ED is fine, A0 is not
		{[]uint32{'a', 272, 'b', 9999}, "ab"},              // special skipped, unknown id ignored
	}
	for _, c := range cases {
		d := NewDecoder(tok, true)
		var out strings.Builder
		for _, id := range c.ids {
			out.WriteString(d.Add(id))
		}
		out.WriteString(d.Flush())
		if out.String() != c.want {
			t.Errorf("ids %v: got %q, want %q", c.ids, out.String(), c.want)
		}
	}
	d := NewDecoder(tok, false)
	if s := d.Add(272); s != "<|im_end|>" {
		t.Errorf("special not emitted without skipSpecial: %q", s)
	}
}

// TestDecoderRandomIDs: a simulated engine emits ids uniformly; the stream
// must stay valid UTF-8, not depend on chunking, and equal Decode when that
// is valid.
func TestDecoderRandomIDs(t *testing.T) {
	tok := builtinBPE(t)
	r := rand.New(rand.NewPCG(5, 6))
	for trial := 0; trial < 200; trial++ {
		ids := make([]uint32, 1+r.IntN(40))
		for i := range ids {
			if r.IntN(2) == 0 {
				ids[i] = uint32(r.IntN(tok.VocabSize() + 10))
			} else {
				ids[i] = uint32(128 + r.IntN(128)) // o200k's high single-byte tokens are common in splits
				ids[i] = tok.byteID[ids[i]]
			}
		}
		d := NewDecoder(tok, false)
		var out strings.Builder
		for _, id := range ids {
			s := d.Add(id)
			if !utf8.ValidString(s) {
				t.Fatalf("invalid UTF-8 %q", s)
			}
			out.WriteString(s)
		}
		out.WriteString(d.Flush())
		whole := NewDecoder(tok, false)
		whole.pending = []byte(tok.Decode(ids))
		want := whole.Flush()
		if out.String() != want {
			t.Fatalf("ids %v: streamed %q, one-shot %q", ids, out.String(), want)
		}
		if raw := tok.Decode(ids); utf8.ValidString(raw) && raw != want {
			t.Fatalf("valid Decode %q differs from stream %q", raw, want)
		}
	}
}

func TestStopMatcher(t *testing.T) {
	cases := []struct {
		stops  []string
		chunks []string
		want   string
		hit    string
	}{
		{[]string{"STOP"}, []string{"hello ST", "OP world"}, "hello ", "STOP"},
		{[]string{"STOP"}, []string{"hello S", "T", "x"}, "hello STx", ""},
		{[]string{"\n\n", "END"}, []string{"a\n", "b\n", "\nc"}, "a\nb", "\n\n"},
		{[]string{"ab", "b"}, []string{"xab"}, "x", "ab"},
		{[]string{"😀"}, []string{"a\U0001F600b"}, "a", "😀"},
		{[]string{"中文"}, []string{"这是中", "国"}, "这是中国", ""},
		{nil, []string{"abc"}, "abc", ""},
		{[]string{""}, []string{"abc"}, "abc", ""},
	}
	for _, c := range cases {
		m := NewStopMatcher(c.stops)
		var out strings.Builder
		stopped := false
		for _, ch := range c.chunks {
			s, st := m.Feed(ch)
			out.WriteString(s)
			if st {
				stopped = true
				break
			}
		}
		if !stopped {
			out.WriteString(m.Flush())
		}
		if out.String() != c.want || m.Hit() != c.hit || stopped != (c.hit != "") {
			t.Errorf("stops %q chunks %q: got %q hit %q, want %q hit %q", c.stops, c.chunks, out.String(), m.Hit(), c.want, c.hit)
		}
	}
}

// TestStopMatcherRandom compares streaming with a naive search on the whole
// text, for random chunkings; nothing is held back that cannot start a stop.
func TestStopMatcherRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 9))
	alphabet := []string{"a", "b", "c", "中", "😀", "\n"}
	gen := func(n int) string {
		var b strings.Builder
		for i := 0; i < n; i++ {
			b.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		return b.String()
	}
	for trial := 0; trial < 2000; trial++ {
		stops := []string{gen(1 + r.IntN(3)), gen(1 + r.IntN(4))}
		text := gen(r.IntN(30))
		want, at := text, -1
		for _, s := range stops {
			if i := strings.Index(text, s); i >= 0 && (at < 0 || i < at) {
				at = i
			}
		}
		if at >= 0 {
			want = text[:at]
		}
		m := NewStopMatcher(stops)
		var out strings.Builder
		rest, stopped := text, false
		for len(rest) > 0 && !stopped {
			n := 1 + r.IntN(len(rest))
			for n < len(rest) && !utf8.RuneStart(rest[n]) {
				n++
			}
			var s string
			s, stopped = m.Feed(rest[:n])
			out.WriteString(s)
			rest = rest[n:]
			if !stopped && out.Len()+len(m.held) != len(text)-len(rest) {
				t.Fatalf("lost text: emitted %q held %q", out.String(), m.held)
			}
			if len(m.held) >= len(stops[0])+len(stops[1]) {
				t.Fatalf("holds too much: %q for stops %q", m.held, stops)
			}
		}
		if !stopped {
			out.WriteString(m.Flush())
		}
		if out.String() != want || stopped != (at >= 0) {
			t.Fatalf("text %q stops %q: got %q (stopped %v), want %q", text, stops, out.String(), stopped, want)
		}
	}
}
