package transfer

import (
	"context"
	"io"
	"net"
	"reflect"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

func TestFetchRoundTrip(t *testing.T) {
	digest := "layers=32,kvh=8,hd=128,bf16,bs=16,tp=1"
	for _, in := range []fetchReq{
		{timeoutMs: 1234, digest: digest, hashes: []uint64{0, 1, 1<<64 - 1, 42}, domain: kv.BaseSeed},
		// A salted request names its domain after the hashes.
		{timeoutMs: 1234, flags: flagDomain, digest: digest, hashes: []uint64{7}, domain: kv.Seed("", "tenant")},
	} {
		b := appendFetch([]byte("prefix"), 99, in)
		h, err := parseHeader(b[6:])
		if err != nil || h.typ != typeFetch || h.op != 99 || h.version != Version || int(h.length) != len(b)-6-headerLen {
			t.Fatalf("header %+v %v", h, err)
		}
		if want := fetchFixed + len(digest) + 8*len(in.hashes) + 8*int(in.flags&flagDomain); int(h.length) != want {
			t.Fatalf("fetch frame of %d bytes, want %d", h.length, want)
		}
		out, err := decodeFetch(b[6+headerLen:])
		if err != nil || !reflect.DeepEqual(in, out) {
			t.Fatalf("decoded %+v %v, want %+v", out, err, in)
		}
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
	f.Add(appendFetch(nil, 1, fetchReq{timeoutMs: 5, hashes: []uint64{3}, domain: 99})[headerLen:])
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

// FuzzServerHandle feeds arbitrary bytes to a server connection handler:
// it must never panic, hang or leak a pin, whatever arrives.
func FuzzServerHandle(f *testing.F) {
	hs := []uint64{11, 22, 33}
	good := appendFetch(nil, 1, fetchReq{timeoutMs: 1000, digest: "d", hashes: hs})
	f.Add(good)
	f.Add(append(append([]byte(nil), good...), good...))
	f.Add(good[:len(good)-3])
	f.Add([]byte("KT\x01\x01\x00\x00\x00\x00\xff\xff\xff\xff"))
	f.Add([]byte("KT\x02\x01\x00\x00\x00\x00\x00\x00\x00\x00"))
	f.Add(append(appendRelease(nil, 2, "req-1"), good...))
	f.Add([]byte("KT\x01\x08\x00\x00\x00\x00\xff\xff\x00\x00"))
	src := NewMemSource(2, 64)
	src.Add(hs...)
	s := &Server{Source: src, IdleTimeout: time.Second}
	s.once.Do(s.defaults)
	f.Fuzz(func(t *testing.T, in []byte) {
		cli, srv := net.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.handle(context.Background(), srv)
			srv.Close()
		}()
		drained := make(chan struct{})
		go func() { io.Copy(io.Discard, cli); close(drained) }()
		cli.SetWriteDeadline(time.Now().Add(2 * time.Second))
		cli.Write(in)
		cli.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("handler did not return after the peer closed")
		}
		<-drained
		if n := src.Pins(); n != 0 {
			t.Fatalf("%d pins leaked", n)
		}
	})
}
