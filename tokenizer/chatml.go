package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
)

// ChatML is the built-in model's chat template, rendered in Go (no Jinja):
//
//	<|im_start|>system\nYou are …<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n
//
// A message's name, when set, follows the role after a space. Assistant tool
// calls are appended to the content as <tool_call>{json}</tool_call> lines
// (the Hermes/Qwen convention); a tool result keeps role "tool".
type ChatML struct{}

// Render implements ChatTemplate.
func (c ChatML) Render(messages []Message, addGenerationPrompt bool) (string, error) {
	var b strings.Builder
	n := len("<|im_start|>assistant\n")
	for _, m := range messages {
		n += len("<|im_start|> \n<|im_end|>\n") + len(m.Role) + len(m.Name) + len(m.Content)
	}
	b.Grow(n) // one allocation for the common case (no tool calls)
	if err := c.renderMessages(&b, 0, messages); err != nil {
		return "", err
	}
	if addGenerationPrompt {
		b.WriteString(c.generationPrompt())
	}
	return b.String(), nil
}

// renderMessages writes messages, the first of which is message number
// first of the conversation (for errors); each renders on its own.
func (ChatML) renderMessages(b *strings.Builder, first int, messages []Message) error {
	for k, m := range messages {
		i := first + k
		if m.Role == "" {
			return fmt.Errorf("tokenizer: message %d has no role", i)
		}
		if strings.ContainsAny(m.Role, "\n") || strings.Contains(m.Role, "<|") {
			return fmt.Errorf("tokenizer: message %d has an invalid role %q", i, m.Role)
		}
		start := b.Len()
		b.WriteString("<|im_start|>")
		b.WriteString(m.Role)
		if m.Name != "" {
			b.WriteByte(' ')
			b.WriteString(m.Name)
		}
		b.WriteByte('\n')
		b.WriteString(m.Content)
		for _, tc := range m.ToolCalls {
			call := map[string]any{"name": tc.Function.Name, "arguments": json.RawMessage(argsJSON(tc.Function.Arguments))}
			j, err := json.Marshal(call)
			if err != nil {
				return fmt.Errorf("tokenizer: message %d tool call %q: %w", i, tc.Function.Name, err)
			}
			if !strings.HasSuffix(b.String()[start:], "\n") {
				b.WriteByte('\n')
			}
			b.WriteString("<tool_call>")
			b.Write(j)
			b.WriteString("</tool_call>")
		}
		b.WriteString("<|im_end|>\n")
	}
	return nil
}

func (ChatML) generationPrompt() string { return "<|im_start|>assistant\n" }

// argsJSON keeps valid JSON arguments as they are and quotes anything else,
// so a malformed arguments string cannot break the rendered JSON.
func argsJSON(s string) []byte {
	if json.Valid([]byte(s)) {
		return []byte(s)
	}
	q, _ := json.Marshal(s)
	return q
}
