package tokenizer

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// TestChatAppenderMatchesRenderChat holds the appender to RenderChat: a
// conversation rendered after any rendered start of it is the same text,
// the same length refusal and the same error.
func TestChatAppenderMatchesRenderChat(t *testing.T) {
	tok := mustO200k(t)
	a := NewChatAppender(tok, ChatML{})
	if a == nil {
		t.Fatal("ChatML renders each message on its own, but no appender")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	pieces := []string{"hello", " <|im_end|>", "<|im_start|>user", "\n", "  ", "é", "\xff", "word ", "<tool_call>"}
	roles := []string{"system", "user", "assistant", "tool", "", "bad\nrole"}
	for trial := range 400 {
		msgs := make([]Message, 1+rng.IntN(6))
		for i := range msgs {
			var sb strings.Builder
			for range rng.IntN(12) {
				sb.WriteString(pieces[rng.IntN(len(pieces))])
			}
			msgs[i] = Message{Role: roles[rng.IntN(4)], Content: sb.String()}
			if rng.IntN(5) == 0 {
				msgs[i].Name = "n" + pieces[rng.IntN(len(pieces))]
			}
			if rng.IntN(8) == 0 {
				msgs[i].ToolCalls = []ToolCall{{Function: FunctionCall{Name: "f", Arguments: `{"a":1}`}}}
			}
			if trial%50 == 0 && i == len(msgs)-1 {
				msgs[i].Role = roles[4+rng.IntN(2)] // an error in the appended part
			}
		}
		max := 0
		if trial%3 == 0 {
			max = rng.IntN(40)
		}
		want, wantOver, wantErr := RenderChat(tok, ChatML{}, msgs, max)
		for k := 0; k <= len(msgs); k++ {
			var prev *RenderedChat
			if k > 0 {
				p, over, err := a.Render(nil, msgs[:k], 0)
				if err != nil || over {
					continue // that start would not have been kept
				}
				if p.Messages() != k {
					t.Fatalf("start of %d messages counts %d", k, p.Messages())
				}
				prev = &p
			}
			got, over, err := a.Render(prev, msgs[k:], max)
			if (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) {
				t.Fatalf("trial %d, start %d: error %v, RenderChat's %v", trial, k, err, wantErr)
			}
			if over != wantOver || got.Text() != want {
				t.Fatalf("trial %d, start %d: over %v text %q, RenderChat's over %v text %q", trial, k, over, got.Text(), wantOver, want)
			}
		}
	}
}

// A Jinja template may render a message by what follows it: no appender.
func TestChatAppenderJinja(t *testing.T) {
	tmpl, err := ParseChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}", "", "")
	if err != nil {
		t.Fatal(err)
	}
	if NewChatAppender(mustO200k(t), tmpl) != nil {
		t.Fatal("an appender for a Jinja template")
	}
}

// A conversation rendered turn after turn, each after the turn before's
// rendering (the pieces shared), is RenderChat's text at every turn, and
// its Tail is the text from where that turn's rendering starts.
func TestChatAppenderChain(t *testing.T) {
	tok := mustO200k(t)
	a := NewChatAppender(tok, ChatML{})
	rng := rand.New(rand.NewPCG(5, 6))
	words := []string{"hello", " <|im_end|>", "\n", "é", "word ", "<|im_start|>assistant"}
	for range 50 {
		var msgs []Message
		var prev *RenderedChat
		for range 1 + rng.IntN(8) {
			n := len(msgs)
			for range rng.IntN(3) {
				var sb strings.Builder
				for range rng.IntN(10) {
					sb.WriteString(words[rng.IntN(len(words))])
				}
				msgs = append(msgs, Message{Role: []string{"user", "assistant"}[rng.IntN(2)], Content: sb.String()})
			}
			rc, over, err := a.Render(prev, msgs[n:], 0)
			if err != nil || over {
				t.Fatal(err, over)
			}
			want, _, _ := RenderChat(tok, ChatML{}, msgs, 0)
			at, tail := rc.Tail()
			if rc.Text() != want || rc.Len() != len(want) || want[at:] != tail || !strings.HasSuffix(want[:rc.MessagesEnd()]+"<|im_start|>assistant\n", want) {
				t.Fatalf("after %d messages: text %q tail %q at %d, RenderChat's %q", len(msgs), rc.Text(), tail, at, want)
			}
			if prev != nil && at != prev.MessagesEnd() {
				t.Fatalf("the tail starts at %d, the turn before's messages end at %d", at, prev.MessagesEnd())
			}
			prev = &rc
		}
	}
}
