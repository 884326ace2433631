package frontend

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
)

var splitSeeds = []string{
	`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`,
	` { "a" : [1, -0.5e+3, 1E2, true, false, null, {"b":{}} , []] , "c":"x\"y\u00e9\n" } `,
	`{}`, `[]`, `{"a":1,"a":2}`, `["a","é",{"k":[[]]}]`, `"plain"`, `"esc\\aped"`, `"caf` + "\xff" + `"`,
	`{"a":01}`, `{"a":1.}`, `{"a":-}`, `{"a":.5}`, `{"a":1e}`, `{"a":tru}`, `{"a":"` + "\x01" + `"}`,
	`{"a":1,}`, `[1,]`, `{"a" 1}`, `{"a":1}x`, `{"a":1}}`, `{"\u0061":1}`, `{"a":"\x"}`, `{"a":"\u12g4"}`,
	`{"a":[1 2]}`, `{"a":{"b":1,"b":}}`, `{"` + "\xff" + `":1}`, `[1]`, `{"a":"` + "\u2028" + `"}`,
	"{\"a\":1}\f", "\t[\r\n1\n]\t",
	`{"messages":[{"role":"user","content":"a"},{"content":"b","content":[1]}],"messages":[{"content":"c"}]}`,
	`{"messages":[{"content":"a","content":"b\n"},{"content":"c"}],"messages":"x"}`,
	`{"messages":[{"content":[{"type":"text","text":"t"}]}, 1]}`, `{"messages":[]}`, `{"messages":[{}]}`,
	`{"model":"m","messages":[{"role":"user","name":"n","content":"caf` + "\xff" + `"},{"content":null}]}`,
}

// checkSplit holds the fast splitter to encoding/json: whatever it accepts,
// encoding/json accepts with the same fields, items or string value.
func checkSplit(t *testing.T, b []byte) {
	if f, ok := splitObject(b); ok {
		var want map[string]json.RawMessage
		dec := json.NewDecoder(bytes.NewReader(b))
		if err := dec.Decode(&want); err != nil || len(bytes.TrimSpace(b[dec.InputOffset():])) > 0 {
			t.Fatalf("splitObject accepted %q; encoding/json: %v", b, err)
		}
		if !maps.EqualFunc(f, want, func(x, y json.RawMessage) bool { return bytes.Equal(x, y) }) {
			t.Fatalf("splitObject(%q) = %q, encoding/json %q", b, f, want)
		}
	}
	if f, msgs, ok := splitChat(b); ok {
		whole, ok := splitObject(b)
		if !ok || !maps.EqualFunc(f, whole, func(x, y json.RawMessage) bool { return bytes.Equal(x, y) }) {
			t.Fatalf("splitChat(%q) = %q, splitObject %q (%v)", b, f, whole, ok)
		}
		if msgs != nil {
			items, ok := splitArray(f["messages"])
			if !ok || len(items) != len(msgs) {
				t.Fatalf("splitChat(%q): %d messages, splitArray %d (%v)", b, len(msgs), len(items), ok)
			}
			for i, it := range items {
				mf, ok := splitObject(it)
				if !ok || !maps.EqualFunc(mf, msgs[i].f, func(x, y json.RawMessage) bool { return bytes.Equal(x, y) }) {
					t.Fatalf("splitChat(%q): message %d %q, splitObject %q (%v)", b, i, msgs[i].f, mf, ok)
				}
				want, plain := plainString(mf["content"])
				if plain != msgs[i].contentOK || want != msgs[i].content {
					t.Fatalf("splitChat(%q): message %d content %q (%v), plainString %q (%v)", b, i, msgs[i].content, msgs[i].contentOK, want, plain)
				}
			}
		}
	}
	if items, ok := splitArray(b); ok {
		var want []json.RawMessage
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatalf("splitArray accepted %q; encoding/json: %v", b, err)
		}
		if !slices.EqualFunc(items, want, func(x, y json.RawMessage) bool { return bytes.Equal(x, y) }) {
			t.Fatalf("splitArray(%q) = %q, encoding/json %q", b, items, want)
		}
	}
	if s, ok := plainString(b); ok {
		var want string
		if err := json.Unmarshal(b, &want); err != nil || s != want {
			t.Fatalf("plainString(%q) = %q; encoding/json %q, %v", b, s, want, err)
		}
	}
	if scanValue(b, 0, 0) == len(b) && !json.Valid(b) {
		t.Fatalf("scanValue accepted %q, which is not JSON", b)
	}
}

func TestSplitJSON(t *testing.T) {
	for _, s := range splitSeeds {
		checkSplit(t, []byte(s))
	}
	// The common shapes take the fast path.
	for _, s := range []string{splitSeeds[0], splitSeeds[1], `{}`, `{"a":1,"a":2}`} {
		if _, ok := splitObject([]byte(s)); !ok {
			t.Errorf("splitObject declined %q", s)
		}
	}
	if _, msgs, ok := splitChat([]byte(splitSeeds[0])); !ok || len(msgs) != 1 || msgs[0].content != "hi" || !msgs[0].contentOK {
		t.Errorf("splitChat(%q) = %+v, %v: want one message read in the same pass", splitSeeds[0], msgs, ok)
	}
	if f, _ := splitObject([]byte(`{"a":1,"a":2}`)); string(f["a"]) != "2" {
		t.Errorf("repeated key: got %s, want the last value", f["a"])
	}
	for _, s := range []string{`{"a":01}`, `{"a":1}x`, `{"a":"` + "\x01" + `"}`, `{"\u0061":1}`, `[1,]`} {
		if _, ok := splitObject([]byte(s)); ok {
			t.Errorf("splitObject accepted %q", s)
		}
	}
	// Every special byte at every offset of the eight-byte fast path.
	for _, sp := range []string{`"`, `\n`, `\u00e9`, `\`, "\x01", "\x1f", "é", "\xff", "\x7f", " "} {
		for pos := 0; pos <= 20; pos++ {
			str := `"` + strings.Repeat("a", pos) + sp + strings.Repeat("b", 20-pos) + `"`
			for _, b := range []string{str, `{"k":` + str + `}`, `[` + str + `]`} {
				checkSplit(t, []byte(b))
				if json.Valid([]byte(b)) != (scanValue([]byte(b), 0, 0) == len(b)) {
					t.Errorf("scanValue(%q) disagrees with json.Valid", b)
				}
			}
		}
	}
	if _, ok := plainString([]byte(`"caf` + "\xff" + `"`)); ok {
		t.Error("plainString accepted invalid UTF-8 (encoding/json replaces it)")
	}
	if s, ok := plainString([]byte(`"café"`)); !ok || s != "café" {
		t.Errorf("plainString(café) = %q, %v", s, ok)
	}
}

func FuzzSplitJSON(f *testing.F) {
	for _, s := range splitSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(checkSplit)
}
