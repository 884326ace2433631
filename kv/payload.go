package kv

import (
	"encoding/binary"
	"fmt"
	"hash"

	"github.com/zeebo/xxh3"

	"github.com/kvmesh/kvmesh/internal/mix"
)

// DefaultPayloadSize is the per-layer payload of a simulated block: small so
// tests and `serve` stay light, large enough that every transfer moves and
// checks real bytes.
const DefaultPayloadSize = 256

// FillPayload writes the deterministic KV bytes of one layer of the block
// with sequence hash seq into dst. The same (seq, layer) always gives the same
// bytes, so any tier or peer can check what it received.
func FillPayload(dst []byte, seq SeqHash, layer int) {
	// splitmix64 stream keyed by (seq, layer): fast and well mixed.
	x := uint64(seq) ^ (uint64(layer)+1)*mix.Golden
	i := 0
	for ; i+8 <= len(dst); i += 8 {
		binary.LittleEndian.PutUint64(dst[i:], mix.Next(&x))
	}
	if i < len(dst) {
		var tail [8]byte
		binary.LittleEndian.PutUint64(tail[:], mix.Next(&x))
		copy(dst[i:], tail[:])
	}
}

// Payload returns a fresh buffer with the bytes FillPayload writes.
func Payload(seq SeqHash, layer, size int) []byte {
	b := make([]byte, size)
	FillPayload(b, seq, layer)
	return b
}

// Checksum is the integrity check carried with every block payload.
func Checksum(b []byte) uint64 { return xxh3.Hash(b) }

// NewChecksum is Checksum over bytes written in parts: its Sum64 is the
// Checksum of the parts joined.
func NewChecksum() hash.Hash64 { return xxh3.New() }

// VerifyPayload checks that b is exactly the payload of (seq, layer) and that
// its checksum matches sum.
func VerifyPayload(b []byte, seq SeqHash, layer int, sum uint64) error {
	if got := Checksum(b); got != sum {
		return fmt.Errorf("block %016x layer %d: checksum %016x, want %016x", seq, layer, got, sum)
	}
	want := Payload(seq, layer, len(b))
	for i := range b {
		if b[i] != want[i] {
			return fmt.Errorf("block %016x layer %d: byte %d differs from its derivation", seq, layer, i)
		}
	}
	return nil
}
