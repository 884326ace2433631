package remote

import (
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

func TestDropIntList(t *testing.T) {
	cases := []struct{ in, want string }{
		{`{"choices":[{"text":"","prompt_token_ids":[1,2,3],"token_ids":[4]}]}`, `{"choices":[{"text":"","prompt_token_ids":null,"token_ids":[4]}]}`},
		{`{"prompt_token_ids" : [ 1, -2 ,3 ],"x":1}`, `{"prompt_token_ids" : null,"x":1}`},
		{`{"prompt_token_ids":[]}`, `{"prompt_token_ids":null}`},
		{`{"prompt_token_ids":null}`, `{"prompt_token_ids":null}`},
		{`{"prompt_token_ids":[[1]]}`, `{"prompt_token_ids":[[1]]}`},     // not flat: left alone
		{`{"prompt_token_ids":[1.5,2]}`, `{"prompt_token_ids":[1.5,2]}`}, // not integers
		{`{"prompt_token_ids":["1"]}`, `{"prompt_token_ids":["1"]}`},
		{`{"text":"say \"prompt_token_ids\":[1]","token_ids":[2]}`, `{"text":"say \"prompt_token_ids\":[1]","token_ids":[2]}`}, // inside a string
		{`{"token_ids":[2]}`, `{"token_ids":[2]}`},
		{`{"prompt_token_ids":[1,2`, `{"prompt_token_ids":[1,2`},
	}
	for _, c := range cases {
		if got := string(DropIntList([]byte(c.in), "prompt_token_ids")); got != c.want {
			t.Errorf("%s: got %s, want %s", c.in, got, c.want)
		}
	}
}

// vllmFrame is the part of a vLLM completion frame an adapter reads.
type vllmFrame struct {
	Choices []struct {
		TokenIDs     []uint32 `json:"token_ids"`
		Text         string   `json:"text"`
		FinishReason *string  `json:"finish_reason"`
	} `json:"choices"`
}

// firstFrame is vLLM's first streamed frame for an n-token prompt with
// return_token_ids: the prompt's ids come back.
func firstFrame(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(i * 7919 % 200000))
	}
	b.WriteString(`],"token_ids":[42]}],"usage":null}`)
	return []byte(b.String())
}

// Decoding with the ids cut out gives what decoding the whole frame gives.
func TestDropIntListDecodesAlike(t *testing.T) {
	data := firstFrame(1000)
	var whole, cut vllmFrame
	if err := json.Unmarshal(data, &whole); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(DropIntList(data, "prompt_token_ids"), &cut); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(whole, cut) || len(cut.Choices) != 1 || cut.Choices[0].TokenIDs[0] != 42 {
		t.Fatalf("whole %+v, cut %+v", whole, cut)
	}
}

// BenchmarkFirstFrame64k: decoding vLLM's first frame of a 64k-token
// prompt as it is and with the echoed prompt ids cut out.
//
//	go test ./engine/remote -run '^$' -bench FirstFrame64k
func BenchmarkFirstFrame64k(b *testing.B) {
	data := firstFrame(65536)
	for _, drop := range []bool{false, true} {
		b.Run(map[bool]string{false: "whole", true: "dropped"}[drop], func(b *testing.B) {
			for b.Loop() {
				d := data
				if drop {
					d = DropIntList(d, "prompt_token_ids")
				}
				var f vllmFrame
				if err := json.Unmarshal(d, &f); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
