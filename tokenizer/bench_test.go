package tokenizer

import (
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"

	tiktoken "github.com/tiktoken-go/tokenizer"
)

// benchText builds a deterministic prompt-like text of roughly n tokens:
// English prose, some code, numbers, a little CJK and emoji.
func benchText(n int) string {
	words := strings.Fields(`the a of to and in is that for it as with was on be by this are at from or an
		which have not has but they their can been more one all would there also its were model cache token
		request router worker block prefix latency throughput memory transfer engine prefill decode server
		client stream response context window attention layer tensor batch queue schedule policy routing
		Kubernetes NVIDIA Dynamo vLLM SGLang TensorRT-LLM GPU CPU network bandwidth hit rate overlap`)
	r := rand.New(rand.NewPCG(7, 7))
	var b strings.Builder
	for b.Len() < n*4 {
		switch r.IntN(20) {
		case 0:
			b.WriteString("\n\n```go\nfunc route(req *Request) (int, error) {\n\tif len(req.Tokens) > 8192 {\n\t\treturn 0, errTooLong\n\t}\n\treturn pick(req), nil\n}\n```\n\n")
		case 1:
			b.WriteString(" 在分布式推理系统中，键值缓存的复用可以显著降低首个令牌的延迟。🚀 ")
		default:
			k := 8 + r.IntN(16)
			for i := 0; i < k; i++ {
				w := words[r.IntN(len(words))]
				if i == 0 {
					w = strings.ToUpper(w[:1]) + w[1:]
				}
				b.WriteString(w)
				if i < k-1 {
					b.WriteByte(' ')
				}
			}
			if r.IntN(4) == 0 {
				b.WriteString(", with ")
				b.WriteString(strings.Repeat("9", 1+r.IntN(6)))
				b.WriteString(" requests per second")
			}
			b.WriteString(". ")
		}
	}
	return b.String()
}

// BenchmarkEncodeO200k8k encodes an ~8k-token prompt; it reports ns/token.
func BenchmarkEncodeO200k8k(b *testing.B) {
	tok := builtinBPE(b)
	text := benchText(8192)
	n := len(tok.Encode(text))
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tok.Encode(text)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/token")
	b.ReportMetric(float64(n), "tokens")
}

// BenchmarkEncodeTiktokenGo8k is the reference library on the same text, for comparison.
func BenchmarkEncodeTiktokenGo8k(b *testing.B) {
	ref, err := tiktoken.Get(tiktoken.O200kBase)
	if err != nil {
		b.Fatal(err)
	}
	text := benchText(8192)
	ids, _, _ := ref.Encode(text)
	n := len(ids)
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ref.Encode(text)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/token")
}

// BenchmarkEncodeChatShort is the request path's preprocessing for a short
// chat (the latency benchmark's prompt): ChatML render, then encode with
// the special tokens the template wrote.
func BenchmarkEncodeChatShort(b *testing.B) {
	tok := builtinBPE(b)
	msgs := []Message{{Role: "user", Content: "frontend stream 17: tell me something about latency"}}
	b.ReportAllocs()
	for b.Loop() {
		text, err := ChatML{}.Render(msgs, true)
		if err != nil {
			b.Fatal(err)
		}
		if len(tok.EncodeWithSpecial(text)) == 0 {
			b.Fatal("no tokens")
		}
	}
}

// BenchmarkGCCycleO200k is one full garbage collection with the o200k
// tables live, the rest of the heap nearly empty: what marking the
// vocabulary adds to every GC cycle of a process that tokenizes.
//
//	go test ./tokenizer -run '^$' -bench GCCycle -benchtime 20x
func BenchmarkGCCycleO200k(b *testing.B) {
	tok, err := O200k()
	if err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	for b.Loop() {
		runtime.GC()
	}
	runtime.KeepAlive(tok)
}

// BenchmarkEncodeO200kDocs encodes the project's own English prose
// (docs/architecture.md and the README, ~40k tokens): a wider vocabulary
// than benchText's, so fewer pre-tokens repeat.
func BenchmarkEncodeO200kDocs(b *testing.B) {
	tok := builtinBPE(b)
	var text []byte
	for _, f := range []string{"../docs/architecture.md", "../README.md"} {
		t, err := os.ReadFile(f)
		if err != nil {
			b.Skip(err)
		}
		text = append(text, t...)
	}
	n := len(tok.Encode(string(text)))
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tok.Encode(string(text))
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/token")
	b.ReportMetric(float64(n), "tokens")
}

// questionText is the user message of turn of the played conversation
// (fleet's BenchmarkServeTurns): numbers, short words and commas, so
// mostly 1–3 digit groups and single-token words.
func questionText(turn int) string {
	var sb strings.Builder
	for i := range 90 {
		sb.WriteString("question " + strconv.Itoa(turn*1000+i) + " is " + strconv.Itoa(i*7) + ", ")
	}
	return sb.String()
}

// BenchmarkEncodeO200kQuestions encodes 16 turns' questions (~10k tokens,
// digit-heavy) as one text; it reports ns/token.
func BenchmarkEncodeO200kQuestions(b *testing.B) {
	tok := builtinBPE(b)
	var sb strings.Builder
	for turn := 1; turn <= 16; turn++ {
		sb.WriteString(questionText(turn))
	}
	text := sb.String()
	n := len(tok.Encode(text))
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tok.Encode(text)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/token")
	b.ReportMetric(float64(n), "tokens")
}

// BenchmarkEncodeO200kQuestion encodes one turn's question (~640 tokens)
// on its own, as serve's tokenize stage sees a new turn's text.
func BenchmarkEncodeO200kQuestion(b *testing.B) {
	tok := builtinBPE(b)
	text := questionText(16)
	n := len(tok.Encode(text))
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tok.Encode(text)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/token")
	b.ReportMetric(float64(n), "tokens")
}
