package events

import (
	"bytes"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvmesh/kvmesh/kv"
)

// SGLang's shape: [ts, events] without a DP rank, positional events with
// SGLang's six BlockStored fields, hashes as signed integers. The decoder
// reads it back bit for bit: a negative SGLang hash is the same 64 bits.
func TestSGLangShapeSignedHashes(t *testing.T) {
	neg := int64(-6917529027641081856)
	b := &Batch{TS: 2.25, Events: []Event{
		{Type: TypeStored, BlockHashes: []kv.EngineHash{kv.EngineHash(neg), 42}, Parent: kv.EngineHash(-1 & (1<<64 - 1)), HasParent: true,
			TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2},
		{Type: TypeRemoved, BlockHashes: []kv.EngineHash{kv.EngineHash(neg)}},
		{Type: TypeCleared},
	}}
	raw, err := EncodeBatch(b, ShapeSGLang)
	if err != nil {
		t.Fatal(err)
	}
	// As Python's msgspec writes it: the generic decoder sees signed ints.
	var generic []any
	if err := msgpack.NewDecoder(bytes.NewReader(raw)).Decode(&generic); err != nil {
		t.Fatal(err)
	}
	if len(generic) != 2 {
		t.Fatalf("batch has %d fields, want [ts, events]", len(generic))
	}
	st := generic[1].([]any)[0].([]any)
	if len(st) != 6 || st[0] != TagStored {
		t.Fatalf("BlockStored %v", st)
	}
	if h := st[1].([]any)[0]; h != neg {
		t.Fatalf("first hash on the wire %v (%T), want %d", h, h, neg)
	}
	if p := st[2]; p != int8(-1) && p != int64(-1) {
		t.Fatalf("parent on the wire %v (%T), want -1", p, p)
	}
	got, _, err := DecodeBatch(raw)
	if err != nil {
		t.Fatal(err)
	}
	if got.HasDPRank || len(got.Events) != 3 {
		t.Fatalf("decoded %+v", got)
	}
	s := got.Events[0]
	if int64(s.BlockHashes[0]) != neg || s.BlockHashes[1] != 42 || int64(s.Parent) != -1 || !s.HasParent || s.BlockSize != 2 || len(s.TokenIDs) != 4 {
		t.Fatalf("stored %+v", s)
	}
	if int64(got.Events[1].BlockHashes[0]) != neg || got.Events[2].Type != TypeCleared {
		t.Fatalf("removed/cleared %+v", got.Events[1:])
	}
	// A tiered store (a KVCR inventory's STORAGE medium) carries its
	// medium, as newer SGLang builds write it.
	b.Events = []Event{{Type: TypeStored, BlockHashes: []kv.EngineHash{kv.EngineHash(neg)}, TokenIDs: []uint32{1, 2}, BlockSize: 2,
		Medium: "STORAGE", HasMedium: true}, {Type: TypeRemoved, BlockHashes: []kv.EngineHash{9}, Medium: "STORAGE", HasMedium: true}}
	if raw, err = EncodeBatch(b, ShapeSGLang); err != nil {
		t.Fatal(err)
	}
	if got, _, err = DecodeBatch(raw); err != nil || got.Events[0].Medium != "STORAGE" || got.Events[1].Medium != "STORAGE" ||
		int64(got.Events[0].BlockHashes[0]) != neg {
		t.Fatalf("tiered events %+v %v", got, err)
	}
	if sh, err := ParseShape("sglang"); err != nil || sh != ShapeSGLang {
		t.Fatalf("ParseShape(sglang) = %v, %v", sh, err)
	}
}
