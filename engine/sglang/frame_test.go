package sglang

import (
	"encoding/json"
	"reflect"
	"strconv"
	"testing"

	"github.com/kvmesh/kvmesh/engine/enginetest"
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
	enginetest.CheckFrames[response](t, frames, 6)
}

func checkFrame(t *testing.T, data []byte) bool {
	t.Helper()
	return enginetest.CheckFrame[response](t, data)
}

// checkSkip: a frame taken with skip is one encoding/json decodes, whose
// output_ids past skip are what DecodeFrame kept.
func checkSkip(t *testing.T, data []byte, skip int) {
	t.Helper()
	fast := response{skip: skip}
	if !fast.DecodeFrame(data) {
		return
	}
	var want response
	if err := json.Unmarshal(data, &want); err != nil {
		t.Fatalf("DecodeFrame took %q with skip %d, encoding/json refuses it: %v", data, skip, err)
	}
	if len(want.OutputIDs) < skip || !reflect.DeepEqual(fast.OutputIDs, want.OutputIDs[skip:]) || fast.skipped != skip {
		t.Fatalf("%q skip %d: kept %v (skipped %d), encoding/json %v", data, skip, fast.OutputIDs, fast.skipped, want.OutputIDs)
	}
	fast.OutputIDs, want.OutputIDs, fast.skip, fast.skipped = nil, nil, 0, 0
	if !reflect.DeepEqual(fast, want) {
		t.Fatalf("%q skip %d: DecodeFrame %+v, encoding/json %+v", data, skip, fast, want)
	}
}

func FuzzDecodeFrame(f *testing.F) {
	for _, fr := range frames {
		f.Add([]byte(fr))
	}
	f.Add([]byte(`{"output_ids":[5,6,7,8],"meta_info":{"completion_tokens":4}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkFrame(t, data)
		for skip := 1; skip <= 3; skip++ {
			checkSkip(t, data, skip)
		}
	})
}

// BenchmarkStreamFrame: one token's frame, decoded as ReadFrames does.
func BenchmarkStreamFrame(b *testing.B) {
	enginetest.BenchFrame[response](b, []byte(frames[0]))
}

// With skip set, a cumulative frame keeps only the ids after skip, and a
// frame that is not cumulative by its count (or too short) is declined,
// to be decoded whole.
func TestDecodeFrameSkipsResentIDs(t *testing.T) {
	for _, c := range []struct {
		frame string
		skip  int
		want  []uint32 // nil: declined
	}{
		{`{"output_ids":[5,6,7,8],"meta_info":{"completion_tokens":4}}`, 3, []uint32{8}},
		{`{"output_ids":[5,6,7,8],"meta_info":{"completion_tokens":4}}`, 4, []uint32{}},
		{`{"meta_info":{"completion_tokens":4},"output_ids":[5,6,7,8]}`, 2, []uint32{7, 8}},
		{`{"output_ids":[5,6,7,8],"meta_info":{"id":"x"}}`, 1, []uint32{6, 7, 8}},
		{`{"output_ids":[5,6,7,8],"meta_info":{"completion_tokens":7}}`, 3, nil}, // incremental: 3 sent + 4 new
		{`{"output_ids":[5,6],"meta_info":{"completion_tokens":2}}`, 3, nil},     // shorter than what was sent
		{`{"output_ids":null}`, 1, nil},
		{`{"text":"x"}`, 1, nil},
	} {
		r := response{skip: c.skip}
		ok := r.DecodeFrame([]byte(c.frame))
		if c.want == nil {
			if ok {
				t.Errorf("%s skip %d: took it (%v), want declined", c.frame, c.skip, r.OutputIDs)
			}
			continue
		}
		if !ok || r.skipped != c.skip || !reflect.DeepEqual(r.OutputIDs, c.want) {
			t.Errorf("%s skip %d: ok %v skipped %d ids %v, want %v", c.frame, c.skip, ok, r.skipped, r.OutputIDs, c.want)
		}
	}
}

// BenchmarkCumulativeStream: the frames of a 360-token answer streamed
// cumulatively (SGLang's default), decoded whole or past what was sent.
func BenchmarkCumulativeStream(b *testing.B) {
	var frames [][]byte
	ids := []byte{}
	for k := 1; k <= 360; k++ {
		if k > 1 {
			ids = append(ids, ',')
		}
		ids = append(ids, []byte(strconv.Itoa(1000+k*37))...)
		frames = append(frames, []byte(`{"text":" x","output_ids":[`+string(ids)+`],"meta_info":{"id":"abc","finish_reason":null,"prompt_tokens":14000,"completion_tokens":`+strconv.Itoa(k)+`,"cached_tokens":0,"e2e_latency":0.03}}`))
	}
	b.Run("encoding-json", func(b *testing.B) {
		for b.Loop() {
			for _, f := range frames {
				var r response
				if err := json.Unmarshal(f, &r); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	for _, skip := range []bool{false, true} {
		b.Run(map[bool]string{false: "whole", true: "skip"}[skip], func(b *testing.B) {
			for b.Loop() {
				for k, f := range frames {
					r := response{}
					if skip {
						r.skip = k
					}
					if !r.DecodeFrame(f) {
						b.Fatal("declined")
					}
				}
			}
		})
	}
}
