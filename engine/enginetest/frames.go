package enginetest

import (
	"encoding/json"
	"reflect"
	"testing"
)

// FrameDecoder is a stream frame type T whose pointer decodes a frame
// itself (remote.FrameDecoder), declining what it does not take.
type FrameDecoder[T any] interface {
	*T
	DecodeFrame(data []byte) bool
}

// CheckFrame holds DecodeFrame to encoding/json: a frame it takes is one
// encoding/json decodes to the same value. It reports whether it took it.
func CheckFrame[T any, P FrameDecoder[T]](t testing.TB, data []byte) bool {
	t.Helper()
	var fast, want T
	if !P(&fast).DecodeFrame(data) {
		return false
	}
	if err := json.Unmarshal(data, &want); err != nil {
		t.Fatalf("DecodeFrame took %q, encoding/json refuses it: %v", data, err)
	}
	if !reflect.DeepEqual(fast, want) {
		t.Fatalf("%q: DecodeFrame %+v, encoding/json %+v", data, fast, want)
	}
	return true
}

// CheckFrames is CheckFrame over frames, of which DecodeFrame must take
// at least wellFormed (the ordinary ones among them).
func CheckFrames[T any, P FrameDecoder[T]](t *testing.T, frames []string, wellFormed int) {
	t.Helper()
	taken := 0
	for _, f := range frames {
		if CheckFrame[T, P](t, []byte(f)) {
			taken++
		}
	}
	if taken < wellFormed {
		t.Fatalf("DecodeFrame took %d of the frames, want at least the %d well-formed ones", taken, wellFormed)
	}
}

// FuzzFrames fuzzes CheckFrame from frames.
func FuzzFrames[T any, P FrameDecoder[T]](f *testing.F, frames []string) {
	for _, fr := range frames {
		f.Add([]byte(fr))
	}
	f.Fuzz(func(t *testing.T, data []byte) { CheckFrame[T, P](t, data) })
}

// BenchFrame decodes one frame as a stream reader does, by DecodeFrame
// and by encoding/json.
func BenchFrame[T any, P FrameDecoder[T]](b *testing.B, data []byte) {
	b.Run("DecodeFrame", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r T
			if !P(&r).DecodeFrame(data) {
				b.Fatal("declined")
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r T
			if err := json.Unmarshal(data, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
}
