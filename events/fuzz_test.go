package events

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzDecodeBatch feeds arbitrary payloads to the decoder: it must never
// panic, every failure must wrap ErrMalformed, and whatever decodes must
// survive an encode/decode round trip unchanged.
func FuzzDecodeBatch(f *testing.F) {
	for _, name := range []string{"array.hex", "map_events.hex", "map.hex", "salted_map_events.hex"} {
		f.Add(loadHex(f, name))
	}
	f.Add(pack(f, []any{1.0, []any{[]any{"BlockStored", []any{int64(-1), []byte{1, 2, 3, 4, 5, 6, 7, 8, 9}}, nil, []any{[]any{1, 2}}, 1}}, nil}))
	f.Add(pack(f, map[string]any{"events": []any{map[string]any{"type": "BlockRemoved", "block_hashes": []any{"ab"}, "x": map[string]any{"y": []any{}}}}}))
	f.Add([]byte{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0x80, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, _, err := DecodeBatch(payload)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		// Conversion must cope with anything the decoder accepts.
		c := Converter{Instance: 1, BlockSize: 2}
		_ = c.Convert(nil, b)
		c0 := Converter{}
		_ = c0.Convert(nil, b)
		// Re-encoding is a fixed point after one normalising pass: what
		// the decoder keeps, the encoder writes back unchanged.
		for _, s := range []Shape{ShapeArray, ShapeMapEvents, ShapeMap} {
			enc1, err := EncodeBatch(b, s)
			if err != nil {
				t.Fatalf("re-encode: %v", err)
			}
			b2, _, err := DecodeBatch(enc1)
			if err != nil {
				t.Fatalf("re-decode %v: %v", s, err)
			}
			enc2, err := EncodeBatch(b2, s)
			if err != nil {
				t.Fatalf("re-encode: %v", err)
			}
			if !bytes.Equal(enc1, enc2) {
				t.Fatalf("%v: unstable encoding\n%x\n%x", s, enc1, enc2)
			}
			if len(b2.Events) != len(b.Events) {
				t.Fatalf("%v: %d events became %d", s, len(b.Events), len(b2.Events))
			}
		}
	})
}
