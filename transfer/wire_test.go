package transfer

import (
	"reflect"
	"testing"
)

func TestFetchRoundTrip(t *testing.T) {
	in := fetchReq{timeoutMs: 1234, digest: "layers=32,kvh=8,hd=128,bf16,bs=16,tp=1", hashes: []uint64{0, 1, 1<<64 - 1, 42}}
	b := appendFetch([]byte("prefix"), 99, in)
	h, err := parseHeader(b[6:])
	if err != nil || h.typ != typeFetch || h.op != 99 || h.version != Version || int(h.length) != len(b)-6-headerLen {
		t.Fatalf("header %+v %v", h, err)
	}
	out, err := decodeFetch(b[6+headerLen:])
	if err != nil || !reflect.DeepEqual(in, out) {
		t.Fatalf("decoded %+v %v, want %+v", out, err, in)
	}
}

func TestStatusRoundTrip(t *testing.T) {
	for _, in := range []status{
		{completed: 7, success: true},
		{code: CodeDigestMismatch, msg: "digest differs"},
	} {
		b := appendStatus(nil, typeDone, 3, in)
		out, err := decodeStatus(b[headerLen:])
		if err != nil || out != in {
			t.Fatalf("decoded %+v %v, want %+v", out, err, in)
		}
	}
	long := make([]byte, 5000)
	b := appendStatus(nil, typeRefuse, 0, status{msg: string(long)})
	if len(b) != headerLen+maxStatusFrame {
		t.Fatalf("long message not truncated: %d bytes", len(b))
	}
}

// FuzzDecodeFetch: the decoder never panics, never returns more hashes
// than the frame carries, and re-encodes what it accepts to the same bytes.
func FuzzDecodeFetch(f *testing.F) {
	f.Add(appendFetch(nil, 1, fetchReq{timeoutMs: 5, digest: "x", hashes: []uint64{1, 2}})[headerLen:])
	f.Add([]byte{})
	f.Add(make([]byte, fetchFixed))
	f.Fuzz(func(t *testing.T, p []byte) {
		r, err := decodeFetch(p)
		if err != nil {
			return
		}
		if 8*len(r.hashes) > len(p) {
			t.Fatalf("%d hashes from %d bytes", len(r.hashes), len(p))
		}
		again := appendFetch(nil, 0, r)[headerLen:]
		if string(again) != string(p) {
			t.Fatalf("re-encoding differs")
		}
	})
}

func FuzzDecodeStatus(f *testing.F) {
	f.Add(appendStatus(nil, typeDone, 1, status{completed: 3, success: true, msg: "ok"})[headerLen:])
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, p []byte) {
		st, err := decodeStatus(p)
		if err != nil {
			return
		}
		if again := appendStatus(nil, typeDone, 0, st)[headerLen:]; string(again) != string(p) {
			t.Fatalf("re-encoding differs")
		}
	})
}
