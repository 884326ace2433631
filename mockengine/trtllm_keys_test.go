package mockengine

import (
	"encoding/json"
	"slices"
	"testing"
)

// topLevelKeys must name exactly the keys encoding/json finds in a valid
// object, whatever the values hold (strings with braces, quotes and escapes,
// nested objects and arrays, escaped keys).
func TestTopLevelKeysAgreeWithDecode(t *testing.T) {
	for _, body := range []string{
		`{}`,
		`{"model":"m","prompt":[1,2,3],"max_tokens":8}`,
		`{"a":{"b":{"c":[1,{"d":2}]}},"e":"}{,\"","f":[[],[{}]]}`,
		`{"k\"ey":1, "x\u0041" : "v" , "kv_hints":{"prompt":"[,]"}}`,
		` { "n" : null , "t" : true , "s" : "\\" , "z" : -1.5e3 } `,
	} {
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		var want []string
		for k := range m {
			want = append(want, k)
		}
		got := topLevelKeys([]byte(body))
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s: keys %q, want %q", body, got, want)
		}
	}
}

func FuzzTopLevelKeys(f *testing.F) {
	f.Add(`{"a":1,"b":{"c":"}"}}`)
	f.Fuzz(func(t *testing.T, body string) {
		var m map[string]json.RawMessage
		if json.Unmarshal([]byte(body), &m) != nil || m == nil {
			return
		}
		got := topLevelKeys([]byte(body))
		seen := map[string]bool{}
		for _, k := range got {
			seen[k] = true
		}
		for k := range m {
			if !seen[k] {
				t.Fatalf("%q: key %q missed (got %q)", body, k, got)
			}
		}
		for _, k := range got {
			if _, ok := m[k]; !ok {
				t.Fatalf("%q: key %q invented", body, k)
			}
		}
	})
}
