package mockengine

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/tokenizer"
)

// BenchmarkIDPrompt: a 64k-token prompt of ids, as kvmesh's adapters send
// it, read by the vLLM stand-in.
//
//	go test ./mockengine -run '^$' -bench IDPrompt
func BenchmarkIDPrompt(b *testing.B) {
	tok, _, err := tokenizer.Builtin()
	if err != nil {
		b.Fatal(err)
	}
	v := &VLLM{core: core{sc: testSim(), tok: tok}}
	raw := []byte{'['}
	for i := range 65536 {
		if i > 0 {
			raw = append(raw, ',')
		}
		raw = strconv.AppendInt(raw, int64(i*7919%100000), 10)
	}
	raw = append(raw, ']')
	for b.Loop() {
		if _, err := v.promptTokens(json.RawMessage(raw)); err != nil {
			b.Fatal(err)
		}
	}
}

// idList agrees with encoding/json on every list it accepts, and leaves
// everything else to it.
func TestIDListMatchesJSON(t *testing.T) {
	cases := []string{"[]", "[ ]", "[1]", " [ 1 , 2,3 ] ", "[-5,0,-0]", "[01]", "[1,]", "[,1]", "[1 2]", "[1.5]", "[1e3]",
		"[123456789012345678]", "[1234567890123456789012]", "[\"1\"]", "[[1]]", "1", "", "[", "[-]", "[9223372036854775807]", "[\t1\n]"}
	r := rand.New(rand.NewPCG(1, 1))
	for range 500 {
		var b []byte
		b = append(b, '[')
		for i := range r.IntN(8) {
			if i > 0 {
				b = append(b, ","[:1]...)
			}
			b = strconv.AppendInt(b, r.Int64N(1<<40)-1<<39, 10)
		}
		cases = append(cases, string(append(b, ']')))
	}
	for _, c := range cases {
		got, ok := idList(json.RawMessage(c))
		var want []int64
		err := json.Unmarshal([]byte(c), &want)
		if ok && (err != nil || !slices.Equal(got, want)) {
			t.Fatalf("%q: idList %v, encoding/json %v (%v)", c, got, want, err)
		}
		long := slices.ContainsFunc(strings.FieldsFunc(c, func(r rune) bool { return r < '0' || r > '9' }), func(d string) bool { return len(d) >= 18 })
		if !ok && err == nil && !long {
			t.Errorf("%q: idList refused a list encoding/json reads as %v", c, want)
		}
	}
}
