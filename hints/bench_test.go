package hints

import (
	"math/rand/v2"
	"testing"
)

// benchEnvelope is a realistic router hint: 256 blocks (16k tokens at block
// size 64) of random 64-bit sequence hashes.
func benchEnvelope() *Envelope {
	r := rand.New(rand.NewPCG(1, 2))
	h := make([]uint64, 256)
	for i := range h {
		h[i] = r.Uint64()
	}
	return NewFetch("sel-0123456789", "tcp://10.0.0.7:23280", h)
}

func BenchmarkParse(b *testing.B) {
	data := benchEnvelope().Marshal()
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMarshal(b *testing.B) {
	env := benchEnvelope()
	b.ReportAllocs()
	for b.Loop() {
		_ = env.Marshal()
	}
}

func BenchmarkNewFetch(b *testing.B) {
	env := benchEnvelope()
	f, _ := env.Fetch()
	b.ReportAllocs()
	for b.Loop() {
		_ = NewFetch("sel", f.SourceEndpoint, f.BlockHashes)
	}
}
