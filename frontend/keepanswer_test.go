package frontend

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/tokenizer"
)

// answerBackend answers every request with ids in one chunk, then eos
// (finish "stop"), or only the first max_tokens of them (finish "length"),
// and records each request's prompt.
type answerBackend struct {
	mu      sync.Mutex
	ids     []uint32
	eos     uint32
	prompts [][]uint32
}

func (b *answerBackend) Generate(_ context.Context, req *kv.GenerateRequest) (kv.TokenStream, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.prompts = append(b.prompts, req.Tokens)
	if n := req.Sampling.MaxTokens; n > 0 && n <= len(b.ids) {
		return &answerStream{ids: slices.Clone(b.ids[:n]), finish: kv.FinishLength, prompt: len(req.Tokens)}, nil
	}
	return &answerStream{ids: append(slices.Clone(b.ids), b.eos), finish: kv.FinishStop, prompt: len(req.Tokens)}, nil
}

type answerStream struct {
	ids    []uint32
	finish kv.FinishReason
	prompt int
	done   bool
}

func (s *answerStream) Recv() (kv.TokenChunk, error) {
	if s.done {
		return kv.TokenChunk{}, io.EOF
	}
	s.done = true
	return kv.TokenChunk{Tokens: s.ids, Finish: s.finish, PromptTokens: s.prompt}, nil
}

func (s *answerStream) Close() error { return nil }

// chatBody is a chat request of the given messages (role, content pairs).
func chatBody(stream bool, salt string, msgs ...string) string {
	var parts []string
	for i := 0; i+1 < len(msgs); i += 2 {
		parts = append(parts, `{"role":"`+msgs[i]+`","content":`+strconv.Quote(msgs[i+1])+`}`)
	}
	return `{"model":"m","stream":` + strconv.FormatBool(stream) + `,"cache_salt":"` + salt + `","messages":[` + strings.Join(parts, ",") + `]}`
}

// A conversation's answer, kept after its turn, is found by the next turn,
// which resends it: the next prompt reuses prompt and answer from the
// prefix cache, and its tokens are those of a whole tokenization.
func TestKeepAnswerServesNextTurn(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run("stream="+strconv.FormatBool(stream), func(t *testing.T) {
			m, err := BuiltinModel("m")
			if err != nil {
				t.Fatal(err)
			}
			tok, tmpl, _ := tokenizer.Builtin()
			m.prefixCache.Verify(0)
			answer := "The answer is 42, as <|im_end|> everyone knows."
			eos, _ := tok.TokenID("<|im_end|>")
			be := &answerBackend{ids: tok.Encode(answer), eos: eos}
			reg := prometheus.NewRegistry()
			s := New(DefaultConfig(), be, models{m}, reg, reg)
			serve := func(body string) { postChatOK(t, s, body) }
			q1 := "What is the answer? " + strings.Repeat("Think hard. ", 50)
			serve(chatBody(stream, "s", "user", q1))
			// From here on nothing is kept: the counts are the requests' own.
			m.KeepAnswer = nil
			before := m.PrefixStats()
			serve(chatBody(stream, "s", "user", q1, "assistant", answer, "user", "Why?"))
			after := m.PrefixStats()

			want, _, err := tokenizer.EncodeChat(tok, tmpl, []tokenizer.Message{{Role: "user", Content: q1}, {Role: "assistant", Content: answer}, {Role: "user", Content: "Why?"}}, 0)
			if err != nil {
				t.Fatal(err)
			}
			if got := be.prompts[len(be.prompts)-1]; !slices.Equal(got, want) {
				t.Fatalf("turn 2's prompt differs from a whole tokenization:\n got %v\nwant %v", got, want)
			}
			prompt1 := len(be.prompts[0])
			if reused := after.Reused - before.Reused; reused < int64(prompt1+len(tok.Encode(answer))) {
				t.Fatalf("turn 2 reused %d tokens; turn 1's prompt and answer are %d+%d", reused, prompt1, len(tok.Encode(answer)))
			}

			// Another tenant's next turn finds nothing of it.
			before = m.PrefixStats()
			serve(chatBody(stream, "other", "user", q1, "assistant", answer, "user", "Why?"))
			if reused := m.PrefixStats().Reused - before.Reused; reused != 0 {
				t.Fatalf("another salt reused %d tokens", reused)
			}
		})
	}
}

// An answer that a stop string or the length limit ended is not kept: the
// client's next turn resends text that no end token closed.
func TestKeepAnswerOnlyAfterEOS(t *testing.T) {
	m, err := BuiltinModel("m")
	if err != nil {
		t.Fatal(err)
	}
	tok, _, _ := tokenizer.Builtin()
	var kept int
	keep := m.KeepAnswer
	m.KeepAnswer = func(salt, prompt, answer string, eos uint32) { kept++; keep(salt, prompt, answer, eos) }
	keepFrom := m.keepAnswerFrom // taken when the prompt's scan is at hand
	m.keepAnswerFrom = func(salt, prompt, answer string, eos uint32, from *tokenizer.CutScan) {
		kept++
		keepFrom(salt, prompt, answer, eos, from)
	}
	eos, _ := tok.TokenID("<|im_end|>")
	be := &answerBackend{ids: tok.Encode("one two three"), eos: eos}
	reg := prometheus.NewRegistry()
	s := New(DefaultConfig(), be, models{m}, reg, reg)
	for _, body := range []string{
		`{"model":"m","messages":[{"role":"user","content":"count"}],"stop":["two"]}`,
		`{"model":"m","messages":[{"role":"user","content":"count"}],"max_tokens":2}`,
		`{"model":"m","messages":[{"role":"user","content":"count"}]}`,
	} {
		postChatOK(t, s, body)
	}
	if kept != 1 {
		t.Fatalf("kept %d answers, want 1 (the one its end token ended)", kept)
	}
}

// postChatOK posts body to s's chat completions and fails t unless it
// answers 200.
func postChatOK(t *testing.T, s http.Handler, body string) {
	t.Helper()
	w := httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)))
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
}
