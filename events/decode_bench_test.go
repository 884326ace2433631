package events

import (
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

// BenchmarkDecodeStored1k: one batch storing 1,024 blocks of 16 tokens
// (a 16k-token prompt's events, ids as a 200k vocabulary makes them),
// decoded.
//
//	go test ./events -run '^$' -bench DecodeStored1k
func BenchmarkDecodeStored1k(b *testing.B) {
	const bs = 16
	toks := make([]kv.Token, 1024*bs)
	for j := range toks {
		toks[j] = kv.Token(j * 7919 % 200000)
	}
	local := kv.NewHasher(bs, "", "").Local(toks)
	blocks := make([]kv.StoredBlock, len(local))
	for j, l := range local {
		blocks[j] = kv.StoredBlock{EngineHash: kv.EngineHash(l) ^ 0x55, LocalHash: l}
	}
	e := kv.Stored(kv.WorkerKey{Instance: 1}, kv.TierDevice, nil, blocks)
	e.Tokens = toks
	payload, err := EncodeBatch(&ToWire([]kv.Event{e}, bs, 1)[0], ShapeMapEvents)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(payload)))
	for b.Loop() {
		if _, _, err := DecodeBatch(payload); err != nil {
			b.Fatal(err)
		}
	}
}
