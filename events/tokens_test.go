package events

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"
)

// tokensBoth decodes b's token array with the fast path and without it.
func tokensBoth(b []byte) (fast, slow []uint32, fastErr, slowErr error, fastLeft, slowLeft int) {
	for _, withBuf := range []bool{true, false} {
		dec := decoderPool.Get().(*decoder)
		dec.r.Reset(b)
		dec.buf = nil
		if withBuf {
			dec.buf = b
		}
		dec.d.Reset(&dec.r)
		out, err := dec.tokens("token_ids")
		if withBuf {
			fast, fastErr, fastLeft = out, err, dec.r.Len()
		} else {
			slow, slowErr, slowLeft = out, err, dec.r.Len()
		}
		dec.buf = nil
		decoderPool.Put(dec)
	}
	return
}

// The fast path decodes every integer width, pairs and bad ids exactly as
// the msgpack library does, and leaves the reader where it does.
func TestTokensFastPathMatchesLibrary(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	elem := func(b []byte) []byte {
		v := r.Uint64N(1 << 33) // some past u32
		if r.IntN(4) == 0 {
			v = r.Uint64N(128)
		}
		switch r.IntN(12) {
		case 0:
			return append(b, 0x7f&byte(v))
		case 1:
			return append(b, 0xcc, byte(v))
		case 2:
			return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(v))
		case 3:
			return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(v))
		case 4:
			return binary.BigEndian.AppendUint64(append(b, 0xcf), v)
		case 5:
			return append(b, 0xd0, byte(v)) // int8, maybe negative
		case 6:
			return binary.BigEndian.AppendUint16(append(b, 0xd1), uint16(v))
		case 7:
			return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(v))
		case 8:
			return binary.BigEndian.AppendUint64(append(b, 0xd3), v)
		case 9:
			return append(b, 0x92, 0x05, 0x01) // a speculative pair
		case 10:
			return append(b, 0xe5) // negative fixint
		}
		return append(b, 0x2a)
	}
	for range 3000 {
		n := r.IntN(20)
		b := []byte{0xdc, 0, byte(n)} // array16
		for range n {
			b = elem(b)
		}
		if r.IntN(5) == 0 && len(b) > 3 {
			b = b[:3+r.IntN(len(b)-3)] // truncated
		}
		b = append(b, 0xc0) // something after the array
		fast, slow, fe, se, fl, sl := tokensBoth(b)
		if (fe == nil) != (se == nil) || !slices.Equal(fast, slow) || (fe == nil && fl != sl) {
			t.Fatalf("% x: fast %v %v (left %d), library %v %v (left %d)", b, fast, fe, fl, slow, se, sl)
		}
		if fe != nil && fe.Error() != se.Error() {
			t.Fatalf("% x: fast error %q, library %q", b, fe, se)
		}
	}
}
