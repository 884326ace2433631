package sglang

import (
	"encoding/json"
	"reflect"
	"testing"
)

// frames are streamed /generate frames as SGLang writes them, and corners
// DecodeFrame must answer as encoding/json does or decline.
var frames = []string{
	`{"text":" the","output_ids":[279],"meta_info":{"id":"abc","finish_reason":null,"prompt_tokens":14000,"completion_tokens":1,"cached_tokens":512,"e2e_latency":0.031}}`,
	`{"text":"","output_ids":[1,2,3],"meta_info":{"id":"abc","finish_reason":{"type":"length","length":8},"prompt_tokens":14000,"completion_tokens":3,"cached_tokens":0,"e2e_latency":1.5e-2}}`,
	`{"text":"a\nb","output_ids":[],"meta_info":{"completion_tokens":null,"prompt_tokens":-0,"cached_tokens":null,"id":null}}`,
	`{"error":{"message":"boom","code":400}}`,
	`{"text":null,"output_ids":null,"meta_info":null,"error":null}`,
	`{"meta_info":{"weights":[[1,2],[3]],"finish_reason":{"type":"abort","message":"x","status_code":400}},"extra":{"a":"é"}}`,
	// Declined or refused by encoding/json as well:
	`{"Text":"x"}`,
	`{"meta_info":{"Prompt_Tokens":5}}`,
	`{"meta_info":{"prompt_tokens":1.5}}`,
	`{"meta_info":{"prompt_tokens":1e3}}`,
	`{"meta_info":{"prompt_tokens":9223372036854775808}}`,
	`{"meta_info":{"prompt_tokens":-9223372036854775808}}`,
	`{"meta_info":{"completion_tokens":"3"}}`,
	`{"output_ids":[1],"output_ids":[2]}`,
	`{"meta_info":{"id":"a"},"meta_info":{"prompt_tokens":1}}`,
	`{"meta_info":[]}`,
	`{"output_ids":[1]}}`,
	`null`,
}

func TestDecodeFrameMatchesJSON(t *testing.T) {
	taken := 0
	for _, f := range frames {
		if checkFrame(t, []byte(f)) {
			taken++
		}
	}
	if taken < 6 {
		t.Fatalf("DecodeFrame took %d of the frames, want at least the 6 well-formed ones", taken)
	}
}

func checkFrame(t *testing.T, data []byte) bool {
	t.Helper()
	var fast response
	ok := fast.DecodeFrame(data)
	var want response
	err := json.Unmarshal(data, &want)
	if !ok {
		return false
	}
	if err != nil {
		t.Fatalf("DecodeFrame took %q, encoding/json refuses it: %v", data, err)
	}
	if !reflect.DeepEqual(fast, want) {
		t.Fatalf("%q: DecodeFrame %+v, encoding/json %+v", data, fast, want)
	}
	return true
}

func FuzzDecodeFrame(f *testing.F) {
	for _, fr := range frames {
		f.Add([]byte(fr))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkFrame(t, data) })
}

// BenchmarkStreamFrame: one token's frame, decoded as ReadFrames does.
func BenchmarkStreamFrame(b *testing.B) {
	data := []byte(frames[0])
	b.Run("DecodeFrame", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r response
			if !r.DecodeFrame(data) {
				b.Fatal("declined")
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r response
			if err := json.Unmarshal(data, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
}
