package bench

// Prompt text for `bench load`. Like aiperf's trace replay, every 512-token
// trace block id maps to a fixed block of text, so requests that share hash
// ids share a text prefix and a KV-aware server sees the same prefix blocks.
// The text is a stream of common English words (each one token with its
// leading space in the BPE vocabularies of current models) picked by a
// splitmix64 stream keyed by the block id.

import (
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/kvmesh/kvmesh/tracefile"
)

// promptWords are lowercase words that o200k/cl100k-style tokenizers encode
// as a single token when preceded by a space (checked in the tests).
var promptWords = [...]string{
	"the", "of", "and", "to", "in", "is", "that", "for", "it", "as",
	"was", "with", "be", "by", "on", "not", "he", "this", "are", "or",
	"his", "from", "at", "which", "but", "have", "an", "had", "they", "you",
	"were", "their", "one", "all", "we", "can", "her", "has", "there", "been",
	"if", "more", "when", "will", "would", "who", "so", "no", "she", "other",
	"its", "may", "these", "what", "them", "than", "some", "him", "time", "into",
	"only", "do", "could", "new", "about", "two", "first", "then", "also", "any",
	"like", "my", "now", "over", "such", "our", "man", "me", "even", "most",
	"made", "after", "many", "before", "must", "through", "back", "years", "where", "much",
	"your", "way", "well", "down", "should", "because", "each", "just", "those", "people",
	"how", "too", "little", "state", "good", "very", "make", "world", "still", "own",
	"see", "men", "work", "long", "get", "here", "between", "both", "life", "being",
	"under", "never", "day", "same", "another", "know", "while", "last", "might", "us",
	"great", "old", "year", "off", "come", "since", "against", "go", "came", "right",
	"used", "take", "three", "states", "himself", "few", "house", "use", "during", "without",
	"again", "place", "around", "however", "home", "small", "found", "thought", "went", "say",
	"part", "once", "general", "high", "upon", "school", "every", "does", "got", "united",
	"left", "number", "course", "war", "until", "always", "away", "something", "fact", "though",
	"water", "less", "public", "put", "think", "almost", "hand", "enough", "far", "took",
	"head", "yet", "government", "system", "better", "set", "told", "nothing", "night", "end",
	"why", "called", "money", "eyes", "find", "going", "look", "asked", "later", "knew",
	"point", "next", "program", "city", "business", "give", "group", "toward", "young", "days",
	"let", "room", "president", "side", "social", "given", "present", "several", "order", "national",
	"possible", "rather", "second", "face", "per", "among", "form", "important", "often", "things",
	"looked", "early", "white", "case", "john", "become", "large", "big", "need", "four",
	"within", "felt", "along", "children", "saw", "best", "church", "ever", "least", "power",
}

// promptWord is word j of the text block with id h.
func promptWord(h uint64, j int) string {
	// tracefile.Token is the project's splitmix64 stream keyed by (id, position).
	return promptWords[uint64(tracefile.Token(h, j))%uint64(len(promptWords))]
}

// segment is the first Tokens words of the text block with id ID.
type segment struct {
	ID     uint64
	Tokens int
}

// appendPrompt writes the text of segs to b, each word with a leading space
// so blocks concatenate without merging tokens.
func appendPrompt(b *strings.Builder, segs []segment) {
	for _, s := range segs {
		for j := 0; j < s.Tokens; j++ {
			b.WriteByte(' ')
			b.WriteString(promptWord(s.ID, j))
		}
	}
}

// promptText is the whole prompt of segs.
func promptText(segs []segment) string {
	n := 0
	for _, s := range segs {
		n += s.Tokens * 8
	}
	var b strings.Builder
	b.Grow(n)
	appendPrompt(&b, segs)
	return b.String()
}

// traceSegments maps a trace request to text segments: one per hash id,
// the last one holding the remainder of the input length.
func traceSegments(req *tracefile.Request, tbs int) []segment {
	segs := make([]segment, 0, len(req.HashIDs))
	left := tracefile.TokenLen(req, tbs)
	for _, id := range req.HashIDs {
		if left <= 0 {
			break
		}
		n := min(left, tbs)
		segs = append(segs, segment{ID: id, Tokens: n})
		left -= n
	}
	if len(segs) == 0 {
		// An empty prompt is rejected by most servers; send one word.
		id := uint64(0)
		if len(req.HashIDs) > 0 {
			id = req.HashIDs[0]
		}
		segs = append(segs, segment{ID: id, Tokens: 1})
	}
	return segs
}

// synthID is the block id of block b of part k (0: the system prompt of
// group g, 1: question q of group g) of the synthetic workload. Top bit set
// keeps synthetic ids apart from trace ids.
func synthID(k, g, q, b int) uint64 {
	x := uint64(tracefile.Token(uint64(k)<<56^uint64(g)<<28^uint64(q), b))
	return x | 1<<63
}

// blockSegments splits n tokens into blocks of at most tbs, with ids id(b).
func blockSegments(dst []segment, n, tbs int, id func(b int) uint64) []segment {
	for b := 0; n > 0; b++ {
		k := min(n, tbs)
		dst = append(dst, segment{ID: id(b), Tokens: k})
		n -= k
	}
	return dst
}

// loadItem is one request of the workload.
type loadItem struct {
	segs         []segment
	inputTokens  int
	outputTokens int
	atMS         float64 // open-loop send time from the run start (trace schedule)
	traceLine    int
	group        int // synthetic group, -1 for trace requests
}

// SyntheticConfig is a shared-prefix workload like SGLang's
// generated-shared-prefix: Groups system prompts of SystemLen tokens, each
// followed by PromptsPerGroup distinct questions of QuestionLen tokens.
type SyntheticConfig struct {
	Groups, PromptsPerGroup int
	SystemLen, QuestionLen  int
	OutputLen               int
}

func (s SyntheticConfig) validate() error {
	switch {
	case s.Groups <= 0 || s.PromptsPerGroup <= 0:
		return fmt.Errorf("synthetic workload needs --groups and --prompts-per-group > 0 (got %d, %d)", s.Groups, s.PromptsPerGroup)
	case s.SystemLen < 0 || s.QuestionLen < 0 || s.SystemLen+s.QuestionLen == 0:
		return fmt.Errorf("synthetic prompt lengths must be >= 0 and not both 0 (got system %d, question %d)", s.SystemLen, s.QuestionLen)
	case s.OutputLen <= 0:
		return fmt.Errorf("synthetic --output-len must be > 0 (got %d)", s.OutputLen)
	case int64(s.Groups)*int64(s.PromptsPerGroup) > 1<<24:
		return fmt.Errorf("synthetic workload of %d×%d prompts is too large", s.Groups, s.PromptsPerGroup)
	}
	return nil
}

// syntheticItems builds the G×P requests in a seeded random order, so the
// groups interleave as they would in live traffic.
func syntheticItems(s SyntheticConfig, tbs int, seed uint64) []loadItem {
	items := make([]loadItem, 0, s.Groups*s.PromptsPerGroup)
	for g := 0; g < s.Groups; g++ {
		for q := 0; q < s.PromptsPerGroup; q++ {
			segs := blockSegments(nil, s.SystemLen, tbs, func(b int) uint64 { return synthID(0, g, 0, b) })
			segs = blockSegments(segs, s.QuestionLen, tbs, func(b int) uint64 { return synthID(1, g, q, b) })
			items = append(items, loadItem{segs: segs, inputTokens: s.SystemLen + s.QuestionLen, outputTokens: s.OutputLen, group: g})
		}
	}
	r := rand.New(rand.NewPCG(seed, seed^0x5851F42D4C957F2D))
	r.Shuffle(len(items), func(i, j int) { items[i], items[j] = items[j], items[i] })
	return items
}

// traceItems converts trace requests, with send times relative to the first
// timestamp divided by speedup.
func traceItems(reqs []tracefile.Request, tbs int, speedup float64) []loadItem {
	items := make([]loadItem, 0, len(reqs))
	var t0 int64
	if len(reqs) > 0 {
		t0 = reqs[0].TimestampMS
		for _, r := range reqs {
			t0 = min(t0, r.TimestampMS)
		}
	}
	for i := range reqs {
		r := &reqs[i]
		out := max(r.OutputLength, 1)
		items = append(items, loadItem{
			segs: traceSegments(r, tbs), inputTokens: tracefile.TokenLen(r, tbs), outputTokens: out,
			atMS: float64(r.TimestampMS-t0) / speedup, traceLine: r.Line, group: -1,
		})
	}
	return items
}

// poissonTimes sets open-loop send times of a Poisson process of the given
// rate (requests per second), seeded.
func poissonTimes(items []loadItem, rate float64, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9E3779B97F4A7C15))
	t := 0.0
	for i := range items {
		if i > 0 {
			t += r.ExpFloat64() / rate * 1000
		}
		items[i].atMS = t
	}
}
