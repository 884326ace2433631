package events

import (
	"bytes"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvmesh/kvmesh/kv"
)

// goldenBatch is the batch every fixture in testdata/golden encodes.
func goldenBatch() *Batch {
	return &Batch{
		TS: 1.5, DPRank: 2, HasDPRank: true,
		Events: []Event{
			{Type: TypeStored, BlockHashes: []kv.EngineHash{7, 300, 1<<63 + 1}, Parent: 5, HasParent: true,
				TokenIDs: []uint32{1, 2, 3, 4, 5, 6}, BlockSize: 2, Medium: "GPU", HasMedium: true,
				LoRAName: "sql-lora", HasLoRAName: true},
			{Type: TypeRemoved, BlockHashes: []kv.EngineHash{300}, Medium: "CPU", HasMedium: true},
			{Type: TypeCleared},
		},
	}
}

var hexSpace = regexp.MustCompile(`\s+`)

func loadHex(t testing.TB, name string) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "golden", name))
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	for _, line := range strings.Split(string(raw), "\n") {
		line, _, _ = strings.Cut(line, "#")
		sb.WriteString(line)
	}
	b, err := hex.DecodeString(hexSpace.ReplaceAllString(sb.String(), ""))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return b
}

func TestGoldenEncode(t *testing.T) {
	for _, tc := range []struct {
		file  string
		shape Shape
	}{{"array.hex", ShapeArray}, {"map_events.hex", ShapeMapEvents}, {"map.hex", ShapeMap}} {
		t.Run(tc.file, func(t *testing.T) {
			want := loadHex(t, tc.file)
			got, err := EncodeBatch(goldenBatch(), tc.shape)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("encoding differs from fixture\n got %x\nwant %x", got, want)
			}
			dec, st, err := DecodeBatch(want)
			if err != nil {
				t.Fatal(err)
			}
			if st.UnknownEvents != 0 {
				t.Fatalf("unknown events %d", st.UnknownEvents)
			}
			if !reflect.DeepEqual(dec, goldenBatch()) {
				t.Fatalf("decoded %+v\nwant    %+v", dec, goldenBatch())
			}
		})
	}
}

// TestGoldenSalted: a salted store in vLLM's extra_keys form encodes to the
// hand-assembled fixture, decodes back with its salt, and converts to local
// hashes seeded by LoRA and salt.
func TestGoldenSalted(t *testing.T) {
	want := &Batch{TS: 1.5, HasDPRank: true, Events: []Event{{Type: TypeStored, BlockHashes: []kv.EngineHash{7, 8},
		TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: "GPU", HasMedium: true,
		LoRAName: "sql-lora", HasLoRAName: true, CacheSalt: "tenant-a"}}}
	fixture := loadHex(t, "salted_map_events.hex")
	got, err := EncodeBatch(want, ShapeMapEvents)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, fixture) {
		t.Fatalf("encoding differs from fixture\n got %x\nwant %x", got, fixture)
	}
	for _, s := range []Shape{ShapeArray, ShapeMapEvents, ShapeMap} {
		enc, err := EncodeBatch(want, s)
		if err != nil {
			t.Fatal(err)
		}
		dec, _, err := DecodeBatch(enc)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(dec, want) {
			t.Fatalf("%v: decoded %+v\nwant    %+v", s, dec, want)
		}
	}
	c := Converter{BlockSize: 2}
	evs := c.Convert(nil, want)
	seed := kv.Seed("sql-lora", "tenant-a")
	if len(evs) != 1 || evs[0].Salt != "tenant-a" || evs[0].Blocks[1].LocalHash != kv.HashTokens([]kv.Token{3, 4}, seed) {
		t.Fatalf("converted %+v", evs)
	}
}

// TestDecodeExtraKeys: the salt is read from the first block's extra_keys
// of a store without a parent, in every form vLLM has used, and nowhere else.
func TestDecodeExtraKeys(t *testing.T) {
	stored := func(parent, lora, extra any) []any {
		return []any{"BlockStored", []any{1, 2}, parent, []any{1, 2, 3, 4}, 2, nil, "GPU", lora, extra, 0, "full_attention"}
	}
	mmKey := []any{"img-hash", 3}
	embeds := []byte{0xde, 0xad}
	for _, tc := range []struct {
		name string
		ev   any
		want string
	}{
		{"lora then salt", stored(nil, "a", []any{[]any{"a", "s"}, []any{"a"}}), "s"},
		{"salt alone", stored(nil, nil, []any{[]any{"s"}, nil}), "s"},
		{"salt equal to the lora name", stored(nil, "a", []any{[]any{"a", "a"}, []any{"a"}}), "a"},
		{"lora, mm tuple, salt, embeds digest", stored(nil, "a", []any{[]any{"a", mmKey, "s", embeds}, []any{"a", embeds}}), "s"},
		{"old int lora id first", stored(nil, nil, []any{[]any{7, "s"}, []any{7}}), "s"},
		{"lora only", stored(nil, "a", []any{[]any{"a"}, []any{"a"}}), ""},
		{"mm and embeds only", stored(nil, nil, []any{[]any{mmKey, embeds}, nil}), ""},
		{"nil extra keys", stored(nil, "a", nil), ""},
		{"empty extra keys", stored(nil, "a", []any{}), ""},
		{"first entry nil", stored(nil, nil, []any{nil, []any{"x"}}), ""},
		{"continuation names no salt", stored(9, nil, []any{[]any{"x"}, nil}), ""},
		{"not a list: skipped", stored(nil, nil, "weird"), ""},
		{"map event", map[string]any{"type": "BlockStored", "extra_keys": []any{[]any{"a", "s"}}, "block_hashes": []any{1},
			"lora_name": "a", "parent_block_hash": nil}, "s"},
		{"map event, parent after extra_keys", map[string]any{"type": "BlockStored", "extra_keys": []any{[]any{"s"}},
			"block_hashes": []any{1}, "parent_block_hash": 5}, ""},
		{"cache_salt key wins", map[string]any{"type": "BlockStored", "extra_keys": []any{[]any{"s"}}, "cache_salt": "k",
			"block_hashes": []any{1}}, "k"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, _, err := DecodeBatch(pack(t, []any{1.0, []any{tc.ev}, 0}))
			if err != nil {
				t.Fatal(err)
			}
			if len(b.Events) != 1 || b.Events[0].CacheSalt != tc.want {
				t.Fatalf("got %+v, want salt %q", b.Events, tc.want)
			}
		})
	}
	// Every truncation of a salted store is an error, never a panic.
	full := pack(t, []any{1.0, []any{stored(nil, "a", []any{[]any{"a", mmKey, "s", embeds}, []any{"a"}})}, 0})
	for n := range len(full) {
		if _, _, err := DecodeBatch(full[:n]); !errors.Is(err, ErrMalformed) {
			t.Fatalf("truncated to %d bytes: err %v", n, err)
		}
	}
}

// pack encodes any Go value with the library's generic encoder: a second,
// independent producer of the shapes engines send.
func pack(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeVariants(t *testing.T) {
	stored := func(hashes, parent any) []any {
		return []any{"BlockStored", hashes, parent, []any{1, 2, 3, 4}, 2, nil, "CPU_PINNED", nil, nil}
	}
	digest := bytes.Repeat([]byte{0xee}, 24)
	digest = append(digest, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08)
	cases := []struct {
		name string
		in   any
		want *Batch
	}{
		{"negative i64 hashes", []any{0.0, []any{stored([]any{int64(-1), int64(-2)}, int64(-3))}, 0},
			&Batch{HasDPRank: true, Events: []Event{{Type: TypeStored, BlockHashes: []kv.EngineHash{^kv.EngineHash(0), ^kv.EngineHash(1)},
				Parent: ^kv.EngineHash(2), HasParent: true, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: "CPU_PINNED", HasMedium: true}}}},
		{"bytes hashes take the last 8 bytes", []any{0.0, []any{stored([]any{digest, []byte{1, 0}}, nil)}, nil},
			&Batch{Events: []Event{{Type: TypeStored, BlockHashes: []kv.EngineHash{0x0102030405060708, 256},
				TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: "CPU_PINNED", HasMedium: true}}}},
		{"missing trailing fields", []any{2.5, []any{[]any{"BlockStored", []any{9}, nil, []any{1, 2}, 2}, []any{"BlockRemoved", []any{9}}}},
			&Batch{TS: 2.5, Events: []Event{{Type: TypeStored, BlockHashes: []kv.EngineHash{9}, TokenIDs: []uint32{1, 2}, BlockSize: 2},
				{Type: TypeRemoved, BlockHashes: []kv.EngineHash{9}}}}},
		{"extra trailing fields", []any{1.0, []any{
			append(stored([]any{1}, 0), 3, "sliding_window", 128, map[string]any{"x": []any{1, 2}}),
			[]any{"BlockRemoved", []any{1}, "GPU", 0, "full_attention"}, []any{"AllBlocksCleared", 1, 2}}, 7, "future"},
			&Batch{TS: 1, DPRank: 7, HasDPRank: true, Events: []Event{
				{Type: TypeStored, BlockHashes: []kv.EngineHash{1}, HasParent: true, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: "CPU_PINNED", HasMedium: true},
				{Type: TypeRemoved, BlockHashes: []kv.EngineHash{1}, Medium: "GPU", HasMedium: true}, {Type: TypeCleared}}}},
		{"map events with unknown keys, any order", []any{1.0, []any{
			map[string]any{"medium": "GPU", "block_hashes": []any{4, 5}, "type": "BlockStored", "group_idx": 0,
				"token_ids": []any{[]any{1, 99}, []any{2, 98}}, "block_size": 1, "cache_salt": "s1", "locality": "LOCAL",
				"lora_name": "a", "extra_keys": []any{[]any{"a"}, nil}, "future": map[string]any{"deep": []any{[]any{1}}}},
			map[string]any{"type": "AllBlocksCleared", "extra": 1}}, nil},
			&Batch{TS: 1, Events: []Event{{Type: TypeStored, BlockHashes: []kv.EngineHash{4, 5}, TokenIDs: []uint32{1, 2}, BlockSize: 1,
				Medium: "GPU", HasMedium: true, LoRAName: "a", HasLoRAName: true, CacheSalt: "s1", Locality: "LOCAL"},
				{Type: TypeCleared}}}},
		{"map batch with unknown keys", map[string]any{"events": []any{[]any{"BlockRemoved", []any{1}}}, "ts": 3, "data_parallel_rank": 1, "engine": "sglang"},
			&Batch{TS: 3, DPRank: 1, HasDPRank: true, Events: []Event{{Type: TypeRemoved, BlockHashes: []kv.EngineHash{1}}}}},
		{"unknown event tags are skipped", []any{1.0, []any{[]any{"BlockMoved", 1, 2}, map[string]any{"type": "Future"}, []any{"AllBlocksCleared"}}, 0},
			&Batch{TS: 1, HasDPRank: true, Events: []Event{{Type: TypeCleared}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := DecodeBatch(pack(t, tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestDecodeUnknownCounted(t *testing.T) {
	_, st, err := DecodeBatch(pack(t, []any{1.0, []any{[]any{"BlockMoved"}, map[string]any{"type": "X"}}, 0}))
	if err != nil || st.UnknownEvents != 2 {
		t.Fatalf("err %v, unknown %d", err, st.UnknownEvents)
	}
}

func TestDecodeRejects(t *testing.T) {
	valid := loadHex(t, "array.hex")
	cases := map[string][]byte{
		"empty":             nil,
		"not a container":   pack(t, 5),
		"batch too short":   pack(t, []any{1.0}),
		"ts wrong type":     pack(t, []any{"x", []any{}, 0}),
		"events not array":  pack(t, []any{1.0, 5, 0}),
		"event scalar":      pack(t, []any{1.0, []any{7}, 0}),
		"event empty":       pack(t, []any{1.0, []any{[]any{}}, 0}),
		"tag not string":    pack(t, []any{1.0, []any{[]any{7}}, 0}),
		"stored no hashes":  pack(t, []any{1.0, []any{[]any{"BlockStored"}}, 0}),
		"map no type":       pack(t, []any{1.0, []any{map[string]any{"block_hashes": []any{1}}}, 0}),
		"map no hashes":     pack(t, []any{1.0, []any{map[string]any{"type": "BlockRemoved"}}, 0}),
		"map batch no evts": pack(t, map[string]any{"ts": 1.0}),
		"hash is float":     pack(t, []any{1.0, []any{[]any{"BlockRemoved", []any{1.5}}}, 0}),
		"hash empty bytes":  pack(t, []any{1.0, []any{[]any{"BlockRemoved", []any{[]byte{}}}}, 0}),
		"token negative":    pack(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{-1}, 1}}, 0}),
		"token too big":     pack(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{int64(1) << 33}, 1}}, 0}),
		"block size neg":    pack(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{1}, -4}}, 0}),
		"dp rank negative":  pack(t, []any{1.0, []any{}, -1}),
		"dp rank string":    pack(t, []any{1.0, []any{}, "0"}),
		"medium int":        pack(t, []any{1.0, []any{[]any{"BlockRemoved", []any{1}, 3}}, 0}),
		"truncated":         valid[:len(valid)-5],
		"trailing bytes":    append(bytes.Clone(valid), 0xc0),
		// A declared array of 2^31 elements must fail on the length check,
		// not allocate.
		"huge array":                {0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0x80, 0, 0, 0, 0},
		"huge map":                  {0xdf, 0x80, 0, 0, 0},
		"huge string":               {0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x92, 0xdb, 0x80, 0, 0, 0, 'B'},
		"huge tokens":               {0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x94, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0x90, 0xc0, 0xdd, 0x7f, 0xff, 0xff, 0xff},
		"huge ext in ignored field": {0x94, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90, 0xc0, 0xc9, 0x7f, 0xff, 0xff, 0xff, 1},
		"deep nesting": append(append([]byte{0x94, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90, 0xc0},
			bytes.Repeat([]byte{0x91}, 100000)...), 0xc0),
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			b, _, err := DecodeBatch(in)
			if err == nil {
				t.Fatalf("decoded %+v, want an error", b)
			}
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
		})
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	b := goldenBatch()
	b.Events = append(b.Events, Event{Type: TypeStored, BlockHashes: []kv.EngineHash{1 << 40}, TokenIDs: []uint32{1 << 31, 0}, BlockSize: 2, LoRAID: 3, HasLoRAID: true})
	b.HasDPRank = false
	for _, s := range []Shape{ShapeArray, ShapeMapEvents, ShapeMap} {
		enc, err := EncodeBatch(b, s)
		if err != nil {
			t.Fatal(err)
		}
		got, _, err := DecodeBatch(enc)
		if err != nil {
			t.Fatal(err)
		}
		b.DPRank = 0
		if !reflect.DeepEqual(got, b) {
			t.Fatalf("%v: got %+v want %+v", s, got, b)
		}
	}
}

func BenchmarkDecodeBatch(b *testing.B) {
	batch := &Batch{TS: 1, HasDPRank: true}
	for i := range 8 {
		ev := Event{Type: TypeStored, BlockHashes: make([]kv.EngineHash, 4), BlockSize: 16, Medium: "GPU", HasMedium: true}
		for j := range ev.BlockHashes {
			ev.BlockHashes[j] = kv.EngineHash(uint64(i*1000+j) * 0x9e3779b97f4a7c15)
		}
		for j := range 64 {
			ev.TokenIDs = append(ev.TokenIDs, uint32(j*1000))
		}
		batch.Events = append(batch.Events, ev)
	}
	for _, s := range []Shape{ShapeArray, ShapeMapEvents} {
		enc, _ := EncodeBatch(batch, s)
		b.Run(s.String(), func(b *testing.B) {
			b.SetBytes(int64(len(enc)))
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := DecodeBatch(enc); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*len(batch.Events))/b.Elapsed().Seconds(), "events/s")
		})
	}
}

func BenchmarkEncodeBatch(b *testing.B) {
	batch := goldenBatch()
	e := NewEncoder()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.EncodeBatch(batch, ShapeArray); err != nil {
			b.Fatal(err)
		}
	}
}
