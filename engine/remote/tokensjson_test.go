package remote

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"reflect"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

func FuzzAppendTokenIDs(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 0, 9, 0, 0, 0, 10, 0, 0, 0, 99, 0, 0, 0, 100, 0, 0, 0})
	f.Add(binary.LittleEndian.AppendUint32(nil, math.MaxUint32))
	f.Add(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, 199_999), 1_000_000_000))
	f.Fuzz(func(t *testing.T, raw []byte) {
		ids := make([]kv.Token, len(raw)/4)
		for i := range ids {
			ids[i] = kv.Token(binary.LittleEndian.Uint32(raw[4*i:]))
		}
		want, err := json.Marshal(ids)
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendTokenIDs([]byte("x"), ids); !bytes.Equal(got[1:], want) || got[0] != 'x' {
			t.Fatalf("AppendTokenIDs(%v) = %s, encoding/json %s", ids, got, want)
		}
	})
}

func TestAppendTokenIDsEveryWidth(t *testing.T) {
	var ids []kv.Token
	for v := uint64(1); v <= math.MaxUint32; v *= 10 {
		ids = append(ids, kv.Token(v-1), kv.Token(v), kv.Token(v+1))
	}
	ids = append(ids, math.MaxUint32)
	want, _ := json.Marshal(ids)
	if got := AppendTokenIDs(nil, ids); !bytes.Equal(got, want) {
		t.Fatalf("got %s, want %s", got, want)
	}
}

// bodyFixture stands for an adapter's request: the token field is left to
// JSONWithTokens.
type bodyFixture struct {
	Model  string     `json:"model"`
	Prompt []kv.Token `json:"-"`
	Max    int        `json:"max_tokens"`
	Stop   []kv.Token `json:"stop_token_ids,omitempty"`
}

func TestJSONWithTokensIsTheWholeObject(t *testing.T) {
	for _, ids := range [][]kv.Token{nil, {}, {7}, {200_018, 0, 12, 99_999}} {
		b := bodyFixture{Model: "m\"x", Prompt: ids, Max: 5, Stop: []kv.Token{1, 2}}
		got, err := JSONWithTokens("prompt", ids, b)
		if err != nil {
			t.Fatal(err)
		}
		var gotMap, wantMap map[string]any
		if err := json.Unmarshal(got, &gotMap); err != nil {
			t.Fatalf("%s: %v", got, err)
		}
		whole, _ := json.Marshal(struct {
			Prompt []kv.Token `json:"prompt"`
			bodyFixture
		}{Prompt: append([]kv.Token{}, ids...), bodyFixture: b})
		if err := json.Unmarshal(whole, &wantMap); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(gotMap, wantMap) {
			t.Fatalf("JSONWithTokens gave %s, encoding/json %s", got, whole)
		}
	}
	if _, err := JSONWithTokens("prompt", nil, struct{}{}); err != nil {
		t.Fatal(err)
	}
	if got, _ := JSONWithTokens("prompt", []kv.Token{1}, struct{}{}); string(got) != `{"prompt":[1]}` {
		t.Fatalf("an otherwise empty object: %s", got)
	}
	if _, err := JSONWithTokens("prompt", nil, []int{1}); err == nil {
		t.Fatal("an array took the place of the request object")
	}
}

// BenchmarkRequestBody is a 10k-token prompt's request body, written by
// encoding/json alone (json) and with its ids written directly (direct).
//
//	go test ./engine/remote -run '^$' -bench RequestBody
func BenchmarkRequestBody(b *testing.B) {
	ids := make([]kv.Token, 10_000)
	x := uint32(12345)
	for i := range ids {
		x = x*1664525 + 1013904223
		ids[i] = kv.Token(x % 200_000)
	}
	type whole struct {
		Model  string     `json:"model"`
		Prompt []kv.Token `json:"prompt"`
		Max    int        `json:"max_tokens"`
	}
	b.Run("json", func(b *testing.B) {
		for b.Loop() {
			if _, err := json.Marshal(whole{Model: "m", Prompt: ids, Max: 5}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			if _, err := JSONWithTokens("prompt", ids, bodyFixture{Model: "m", Max: 5}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
