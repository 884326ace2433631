package tokenizer

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func loadTiny(t *testing.T, file string) *BPE {
	t.Helper()
	tok, tmpl, err := LoadHF(filepath.Join("testdata", "tiny", file), "")
	if err != nil {
		t.Fatal(err)
	}
	if tmpl != nil {
		t.Fatal("template without config")
	}
	return tok
}

// Ids in testdata/tiny: bytes are ids 0-255 (id = byte value); merged tokens
// Ġt=256 he=257 Ġthe=258 the=259 ca=260 cat=261 Ġcat=262 aa=263 aaaa=264
// bc=265 ab=266 ä¸=267 Ġc=268, xyz=269 (no merge builds it); added
// <|endoftext|>=270 <|im_start|>=271 <|im_end|>=272 (special), <think>=273
// (not special). Merge ranks follow the list order in the file: (Ġ,t) (h,e)
// (Ġt,he) (t,he) (c,a) (ca,t) (Ġ,cat) (a,a) (aa,aa) (a,b) (b,c) (ä,¸) (Ġ,c).
func TestHFKnownEncodings(t *testing.T) {
	qwen := loadTiny(t, "tokenizer.json")
	gpt2 := loadTiny(t, "tokenizer_gpt2.json")
	cases := []struct {
		name  string
		tok   *BPE
		text  string
		spec  bool
		want  []uint32
		round string // expected Decode, when it differs from text
	}{
		// the: (h,e) then (t,he); " cat": (c,a) beats (Ġ,c), then (ca,t), (Ġ,cat).
		{"merges", qwen, "the cat", false, []uint32{259, 262}, ""},
		// (a,b) has the lower merge rank though "bc" has the lower id.
		{"pair rank not id", qwen, "abc", false, []uint32{266, 'c'}, ""},
		// equal ranks merge leftmost first: aa a a a -> aa aa a -> aaaa a
		{"leftmost", qwen, "aaaaa", false, []uint32{264, 'a'}, ""},
		{"vocab without merge", qwen, "xyz", false, []uint32{'x', 'y', 'z'}, ""},
		{"ignore_merges", gpt2, "xyz", false, []uint32{269}, ""},
		{"gpt2 pattern", gpt2, "the the", false, []uint32{259, 258}, ""},
		// 中 = E4 B8 AD; (ä,¸) merges the first two bytes.
		{"cjk bytes", qwen, "中", false, []uint32{267, 0xAD}, ""},
		// NFC composes e + U+0301 into é (C3 A9) before BPE.
		{"nfc", qwen, "e\u0301", false, []uint32{0xC3, 0xA9}, "é"},
		{"no normalizer", gpt2, "e\u0301", false, []uint32{'e', 0xCC, 0x81}, ""},
		{"special", qwen, "<|im_start|>user<think>", true, []uint32{271, 'u', 's', 'e', 'r', 273}, ""},
		{"special as text", qwen, "<|im_end|><think>", false, []uint32{'<', '|', 'i', 'm', '_', 'e', 'n', 'd', '|', '>', 273}, ""},
	}
	for _, c := range cases {
		var got []uint32
		if c.spec {
			got = c.tok.EncodeWithSpecial(c.text)
		} else {
			got = c.tok.Encode(c.text)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: Encode(%q) = %v, want %v", c.name, c.text, got, c.want)
		}
		want := c.text
		if c.round != "" {
			want = c.round
		}
		if d := c.tok.Decode(got); d != want {
			t.Errorf("%s: Decode = %q, want %q", c.name, d, want)
		}
	}
	if qwen.VocabSize() != 274 || !qwen.IsSpecial(272) || qwen.IsSpecial(273) {
		t.Errorf("VocabSize %d, IsSpecial(272)=%v IsSpecial(273)=%v", qwen.VocabSize(), qwen.IsSpecial(272), qwen.IsSpecial(273))
	}
	if s := qwen.Decode([]uint32{274, 1 << 30, 'a'}); s != "a" {
		t.Errorf("unknown ids decode to %q", s)
	}
}

// TestHFHeapMatchesScan: long pieces take the heap path; both must agree.
func TestHFHeapMatchesScan(t *testing.T) {
	for _, tok := range []*BPE{loadTiny(t, "tokenizer.json"), builtinBPE(t)} {
		for _, piece := range []string{strings.Repeat("a", 200), strings.Repeat("ab", 70) + "c", strings.Repeat("the cat ", 20), strings.Repeat(" ", 130) + "x", strings.Repeat("中文", 40)} {
			var s mergeScratch
			heap := tok.bytePairMergeHeap(nil, piece, &s)
			scan := tok.bytePairMergeScanForTest(piece)
			if !slices.Equal(heap, scan) {
				t.Fatalf("%s %q: heap %v, scan %v", tok.Name(), piece, heap, scan)
			}
		}
	}
}

func TestHFRejectsUnsupported(t *testing.T) {
	base, err := os.ReadFile(filepath.Join("testdata", "tiny", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string][2]string{
		"wordpiece":  {`"type": "BPE"`, `"type": "WordPiece"`},
		"fallback":   {`"byte_fallback": false`, `"byte_fallback": true`},
		"normalizer": {`"type": "NFC"`, `"type": "Lowercase"`},
		"split":      {`"behavior": "Isolated"`, `"behavior": "Removed"`},
		"bad merge":  {`"Ġ t",`, `"Ġ q9",`},
		"syntax":     {`"version"`, `version`},
	}
	for name, c := range cases {
		mod := strings.Replace(string(base), c[0], c[1], 1)
		if mod == string(base) {
			t.Fatalf("%s: fixture does not contain %q", name, c[0])
		}
		if _, err := ParseHF("x", []byte(mod)); err == nil {
			t.Errorf("%s: accepted", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	if _, _, err := LoadHF("testdata/none/tokenizer.json", ""); err == nil {
		t.Error("missing file accepted")
	}
}
