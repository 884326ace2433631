package tracefile

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

const sample = `{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]}
{"timestamp": 3000, "input_length": 1500, "output_length": 7, "hash_ids": [0, 1, 3]}

not json
{"timestamp": 3001, "input_length": 100, "output_length": 1, "hash_ids": [0, 1]}
{"timestamp": 3002, "input_length": 10, "hash_ids": [-4]}
{"timestamp": 3003, "output_length": 1, "hash_ids": [4]}
{"timestamp": 3004, "input_length": 512, "output_length": 2, "hash_ids": [9]} {}
{"timestamp": 3005, "input_length": 513, "output_length": 2, "hash_ids": [0, 8]}
`

func TestParseReportsBadLines(t *testing.T) {
	reqs, errs, err := Parse(strings.NewReader(sample), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 3 || reqs[0].Line != 1 || reqs[1].Line != 2 || reqs[2].Line != 9 {
		t.Fatalf("requests %+v", reqs)
	}
	if reqs[1].TimestampMS != 3000 || reqs[1].InputLength != 1500 || reqs[1].OutputLength != 7 || len(reqs[1].HashIDs) != 3 {
		t.Fatalf("request 2 = %+v", reqs[1])
	}
	wantLines := []int{4, 5, 6, 7, 8}
	if len(errs) != len(wantLines) {
		t.Fatalf("errors %v", errs)
	}
	for i, e := range errs {
		if e.Line != wantLines[i] {
			t.Errorf("error %d on line %d, want %d (%v)", i, e.Line, wantLines[i], e)
		}
		if !strings.HasPrefix(e.Error(), "line ") {
			t.Errorf("error text %q lacks the line", e.Error())
		}
	}
	_, errs, err = Parse(strings.NewReader(sample), Options{Strict: true})
	var le LineError
	if !errors.As(err, &le) || le.Line != 4 || len(errs) != 1 {
		t.Fatalf("strict: %v %v", err, errs)
	}
	reqs, _, _ = Parse(strings.NewReader(sample), Options{MaxLines: 2})
	if len(reqs) != 2 {
		t.Fatalf("MaxLines 2 gave %d requests", len(reqs))
	}
}

func TestTokensLengthsAndSharing(t *testing.T) {
	reqs, _, err := Parse(strings.NewReader(sample), Options{})
	if err != nil {
		t.Fatal(err)
	}
	a, b := Tokens(&reqs[0], 512), Tokens(&reqs[1], 512)
	if len(a) != 1100 || len(b) != 1500 {
		t.Fatalf("lengths %d %d", len(a), len(b))
	}
	// Ids 0 and 1 are shared: the first 1024 tokens agree; id 2 vs 3 differ.
	for i := 0; i < 1024; i++ {
		if a[i] != b[i] {
			t.Fatalf("token %d differs across equal ids", i)
		}
	}
	same := 0
	for i := 1024; i < 1100; i++ {
		if a[i] == b[i] {
			same++
		}
	}
	if same > 2 {
		t.Fatalf("%d of 76 tokens equal across different ids", same)
	}
	// Tokens inside one id's block differ by offset too.
	if a[0] == a[1] && a[1] == a[2] {
		t.Fatal("tokens within a block are constant")
	}
	for _, bs := range []int{64, 100, 512} {
		e := NewExpander(512, bs, kv.BaseSeed)
		for _, r := range reqs {
			want := kv.LocalHashes(nil, Tokens(&r, 512), bs, kv.BaseSeed)
			got := e.LocalHashes(nil, &r)
			if len(got) != len(want) || len(got) != r.InputLength/bs {
				t.Fatalf("bs %d: %d blocks, want %d", bs, len(got), len(want))
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("bs %d block %d differs", bs, i)
				}
			}
		}
	}
	la := NewExpander(512, 64, kv.BaseSeed).LocalHashes(nil, &reqs[0])
	lb := NewExpander(512, 64, kv.BaseSeed).LocalHashes(nil, &reqs[1])
	for i := 0; i < 16; i++ {
		if la[i] != lb[i] {
			t.Fatalf("engine block %d differs across equal ids", i)
		}
	}
	if la[16] == lb[16] {
		t.Fatal("engine block 16 equal across different ids")
	}
}

func TestLoadConversationTrace(t *testing.T) {
	const path = "../../shared/traces/conversation_trace.jsonl"
	if _, err := os.Stat(path); err != nil {
		t.Skip("trace not present")
	}
	reqs, errs, err := Load(path, Options{Strict: true})
	if err != nil || len(errs) != 0 || len(reqs) != 12031 {
		t.Fatalf("%d requests, %d errors, %v", len(reqs), len(errs), err)
	}
	if _, _, err := Load("/nonexistent/trace.jsonl", Options{}); err == nil {
		t.Fatal("missing file must fail")
	}
}

func BenchmarkExpanderLocalHashes(b *testing.B) {
	req := Request{InputLength: 12000, HashIDs: make([]uint64, 24)}
	for i := range req.HashIDs {
		req.HashIDs[i] = uint64(i * 7)
	}
	e := NewExpander(512, 64, kv.BaseSeed)
	var dst []kv.LocalHash
	for b.Loop() {
		dst = e.LocalHashes(dst[:0], &req)
	}
}
