package bench

import (
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/tokenizer"
	"github.com/kvmesh/kvmesh/tracefile"
)

func TestPromptTextByHashIDs(t *testing.T) {
	a := promptText([]segment{{7, 512}, {8, 512}})
	b := promptText([]segment{{7, 512}, {8, 512}})
	if a != b {
		t.Fatal("equal ids gave different text")
	}
	if n := len(strings.Fields(a)); n != 1024 {
		t.Fatalf("%d words for 1024 tokens", n)
	}
	c := promptText([]segment{{7, 512}, {9, 512}})
	if c == a {
		t.Fatal("different ids gave equal text")
	}
	// The shared first block is a common prefix, the differing one is not.
	first := promptText([]segment{{7, 512}})
	if !strings.HasPrefix(a, first) || !strings.HasPrefix(c, first) {
		t.Fatal("shared block is not a shared prefix")
	}
	if promptText([]segment{{8, 512}}) == promptText([]segment{{9, 512}}) {
		t.Fatal("blocks 8 and 9 are equal")
	}
	// A partial last block is a prefix of the full block.
	if !strings.HasPrefix(promptText([]segment{{8, 512}}), promptText([]segment{{8, 100}})) {
		t.Fatal("partial block is not a prefix of the full one")
	}
	// Distinct ids differ within their first few words (so a server's
	// block-level prefix cache cannot match across different ids).
	seen := map[string]uint64{}
	for id := uint64(0); id < 5000; id++ {
		k := promptText([]segment{{id, 8}})
		if prev, ok := seen[k]; ok {
			t.Fatalf("ids %d and %d share their first 8 words", prev, id)
		}
		seen[k] = id
	}
}

func TestTraceSegments(t *testing.T) {
	req := tracefile.Request{InputLength: 1100, OutputLength: 0, HashIDs: []uint64{3, 4, 5}}
	segs := traceSegments(&req, 512)
	if len(segs) != 3 || segs[0] != (segment{3, 512}) || segs[2] != (segment{5, 76}) {
		t.Fatalf("segments %v", segs)
	}
	items := traceItems([]tracefile.Request{{TimestampMS: 1000, InputLength: 10, HashIDs: []uint64{1}}, {TimestampMS: 4000, InputLength: 0, HashIDs: nil, OutputLength: 7}}, 512, 2)
	if items[0].atMS != 0 || items[1].atMS != 1500 {
		t.Fatalf("send times %v %v", items[0].atMS, items[1].atMS)
	}
	if items[0].outputTokens != 1 || items[1].outputTokens != 7 {
		t.Fatal("output lengths not carried (0 becomes 1)")
	}
	if items[1].segs[0].Tokens != 1 {
		t.Fatal("an empty prompt must still send one word")
	}
}

func TestSyntheticSharedPrefixes(t *testing.T) {
	s := SyntheticConfig{Groups: 3, PromptsPerGroup: 4, SystemLen: 700, QuestionLen: 50, OutputLen: 9}
	items := syntheticItems(s, 512, 1)
	if len(items) != 12 {
		t.Fatalf("%d items", len(items))
	}
	sys := map[int]string{}
	questions := map[string]bool{}
	order := ""
	for _, it := range items {
		words := strings.Fields(promptText(it.segs))
		if len(words) != 750 || it.inputTokens != 750 || it.outputTokens != 9 {
			t.Fatalf("prompt of %d words, %d tokens", len(words), it.inputTokens)
		}
		p := strings.Join(words[:700], " ")
		if prev, ok := sys[it.group]; ok && prev != p {
			t.Fatalf("group %d has two system prompts", it.group)
		}
		sys[it.group] = p
		q := strings.Join(words[700:], " ")
		if questions[q] {
			t.Fatal("two prompts share a question")
		}
		questions[q] = true
		order += string(rune('0' + it.group))
	}
	if sys[0] == sys[1] || sys[1] == sys[2] {
		t.Fatal("groups share a system prompt")
	}
	if order == "000011112222" {
		t.Fatal("synthetic order is not shuffled")
	}
	again := syntheticItems(s, 512, 1)
	for i := range items {
		if promptText(items[i].segs) != promptText(again[i].segs) {
			t.Fatal("synthetic workload not deterministic")
		}
	}
}

func TestPoissonTimes(t *testing.T) {
	items := make([]loadItem, 4000)
	poissonTimes(items, 100, 7)
	mean := items[len(items)-1].atMS / float64(len(items)-1)
	if mean < 9 || mean > 11 {
		t.Fatalf("mean gap %.2f ms, want about 10", mean)
	}
	for i := 1; i < len(items); i++ {
		if items[i].atMS < items[i-1].atMS {
			t.Fatal("arrivals not ordered")
		}
	}
	other := make([]loadItem, 4000)
	poissonTimes(other, 100, 7)
	if other[100].atMS != items[100].atMS {
		t.Fatal("same seed, different schedule")
	}
	poissonTimes(other, 100, 8)
	if other[100].atMS == items[100].atMS {
		t.Fatal("different seeds, same schedule")
	}
}

// Each word of the corpus is one o200k token after a space, so a block of
// n words is about n tokens for current BPE tokenizers.
func TestPromptWordsAreSingleTokens(t *testing.T) {
	tok, err := tokenizer.O200k()
	if err != nil {
		t.Skipf("o200k unavailable: %v", err)
	}
	seen := map[string]bool{}
	for _, w := range promptWords {
		if seen[w] {
			t.Errorf("duplicate word %q", w)
		}
		seen[w] = true
		if ids := tok.Encode(" " + w); len(ids) != 1 {
			t.Errorf("%q is %d tokens", " "+w, len(ids))
		}
	}
	text := promptText([]segment{{42, 512}, {43, 512}})
	if n := len(tok.Encode(text)); n < 1000 || n > 1030 {
		t.Fatalf("1024 words tokenize to %d o200k tokens", n)
	}
}

// BenchmarkEncodeO200kTracePrompt encodes the text `bench load` sends for
// a ~14k-token conversation-trace prompt (28 blocks of 512 tokens, ids as
// the trace numbers them): what serve tokenizes in engine-compare. It
// reports ns/token.
//
//	go test ./bench -run '^$' -bench EncodeO200kTracePrompt
func BenchmarkEncodeO200kTracePrompt(b *testing.B) {
	tok, err := tokenizer.O200k()
	if err != nil {
		b.Fatal(err)
	}
	segs := make([]segment, 28)
	for i := range segs {
		segs[i] = segment{ID: uint64(i), Tokens: 512}
	}
	text := promptText(segs)
	n := len(tok.Encode(text))
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tok.Encode(text)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/token")
	b.ReportMetric(float64(n), "tokens")
}
