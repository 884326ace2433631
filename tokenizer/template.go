package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
)

// JinjaTemplate is a Hugging Face chat template rendered with gonja. It is
// parsed once and safe for concurrent Render calls.
type JinjaTemplate struct {
	tmpl     *exec.Template
	bosToken string
	eosToken string
}

var _ ChatTemplate = (*JinjaTemplate)(nil)

// EOSToken is the tokenizer config's eos_token ("" if none).
func (j *JinjaTemplate) EOSToken() string { return j.eosToken }

// ErrTemplate marks errors the template raised itself (raise_exception),
// e.g. "Conversation roles must alternate": the request was invalid.
var ErrTemplate = errors.New("chat template rejected the conversation")

type templateConfig struct {
	ChatTemplate json.RawMessage `json:"chat_template"`
	BOSToken     json.RawMessage `json:"bos_token"`
	EOSToken     json.RawMessage `json:"eos_token"`
}

// LoadChatTemplate reads chat_template, bos_token and eos_token from a
// tokenizer_config.json. chat_template may be a string or a list of
// {"name", "template"} (the "default" entry is used, else the first);
// bos/eos may be strings, null or AddedToken objects with "content".
func LoadChatTemplate(configPath string) (*JinjaTemplate, error) {
	data, err := os.ReadFile(configPath)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	var c templateConfig
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("tokenizer: parse %s: %w", configPath, err)
	}
	src, err := pickTemplate(c.ChatTemplate)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", configPath, err)
	}
	bos, err := tokenContent(c.BOSToken)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: bos_token: %w", configPath, err)
	}
	eos, err := tokenContent(c.EOSToken)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: eos_token: %w", configPath, err)
	}
	t, err := ParseChatTemplate(src, bos, eos)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", configPath, err)
	}
	return t, nil
}

func pickTemplate(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", errors.New("no chat_template")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", fmt.Errorf("chat_template is neither a string nor a list of named templates: %w", err)
	}
	if len(named) == 0 {
		return "", errors.New("chat_template is an empty list")
	}
	for _, n := range named {
		if n.Name == "default" {
			return n.Template, nil
		}
	}
	return named[0].Template, nil
}

func tokenContent(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.Content == nil {
		return "", fmt.Errorf("neither a string nor an object with content: %s", raw)
	}
	return *obj.Content, nil
}

// templateEnv is gonja's default environment plus what HF chat templates
// expect from transformers' Jinja setup.
var templateEnv = func() *exec.Environment {
	ctx := exec.EmptyContext().Update(builtins.GlobalFunctions).Update(builtins.GlobalVariables)
	ctx.Set("strftime_now", func(_ *exec.Evaluator, params *exec.VarArgs) (string, error) {
		if len(params.Args) != 1 || !params.Args[0].IsString() {
			return "", errors.New("strftime_now expects one format string")
		}
		return strftime(time.Now(), params.Args[0].String()), nil
	})
	// gonja's range feeds a channel from a goroutine, which leaks when a
	// template stops early (an error mid-loop); a list has no goroutine.
	ctx.Set("range", func(_ *exec.Evaluator, params *exec.VarArgs) ([]int, error) {
		var a [3]int
		n := len(params.Args)
		if n < 1 || n > 3 {
			return nil, errors.New("range expects [start, ]stop[, step]")
		}
		for i, v := range params.Args {
			if !v.IsInteger() {
				return nil, errors.New("range arguments must be integers")
			}
			a[i] = v.Integer()
		}
		start, stop, step := 0, a[0], 1
		if n >= 2 {
			start, stop = a[0], a[1]
		}
		if n == 3 {
			step = a[2]
		}
		if step == 0 {
			return nil, errors.New("range step cannot be 0")
		}
		var out []int
		for i := start; (step > 0 && i < stop) || (step < 0 && i > stop); i += step {
			if len(out) >= 1<<20 {
				return nil, errors.New("range too long")
			}
			out = append(out, i)
		}
		return out, nil
	})
	filters := exec.NewFilterSet(map[string]exec.FilterFunction{}).Update(builtins.Filters)
	if err := filters.Replace("tojson", tojsonFilter); err != nil {
		panic(err) // gonja always has tojson; this runs at init, never on input
	}
	return &exec.Environment{
		Context:           ctx,
		Filters:           filters,
		Tests:             builtins.Tests,
		ControlStructures: builtins.ControlStructures,
		Methods:           builtins.Methods,
	}
}()

// ParseChatTemplate compiles a Jinja chat template. Like transformers it
// renders with trim_blocks and lstrip_blocks.
func ParseChatTemplate(source, bosToken, eosToken string) (*JinjaTemplate, error) {
	cfg := config.New()
	cfg.TrimBlocks = true
	cfg.LeftStripBlocks = true
	cfg.KeepTrailingNewline = false
	loader, err := loaders.NewMemoryLoader(map[string]string{"/chat_template": source})
	if err != nil {
		return nil, fmt.Errorf("chat template: %w", err)
	}
	t, err := exec.NewTemplate("/chat_template", cfg, loader, templateEnv)
	if err != nil {
		return nil, fmt.Errorf("parse chat template: %w", err)
	}
	return &JinjaTemplate{tmpl: t, bosToken: bosToken, eosToken: eosToken}, nil
}

// Render implements ChatTemplate.
func (j *JinjaTemplate) Render(messages []Message, addGenerationPrompt bool) (string, error) {
	return j.RenderWith(messages, addGenerationPrompt, nil)
}

// RenderWith renders with extra template variables (e.g. "tools",
// "enable_thinking"); they cannot override messages or the special tokens.
func (j *JinjaTemplate) RenderWith(messages []Message, addGenerationPrompt bool, extra map[string]any) (string, error) {
	vars := make(map[string]any, len(extra)+4)
	for k, v := range extra {
		vars[k] = v
	}
	vars["messages"] = messagesForTemplate(messages)
	vars["add_generation_prompt"] = addGenerationPrompt
	vars["bos_token"] = j.bosToken
	vars["eos_token"] = j.eosToken
	// raise_exception is bound per render: gonja flattens the errors of
	// functions into text, so the message is captured here instead.
	raised := ""
	vars["raise_exception"] = func(_ *exec.Evaluator, params *exec.VarArgs) (string, error) {
		raised = "raise_exception called"
		if len(params.Args) > 0 {
			raised = params.Args[0].String()
		}
		return "", fmt.Errorf("%w: %s", ErrTemplate, raised)
	}
	out, err := j.tmpl.ExecuteToString(exec.NewContext(vars))
	if raised != "" {
		return "", fmt.Errorf("%w: %s", ErrTemplate, raised)
	}
	if err != nil {
		return "", fmt.Errorf("render chat template: %w", err)
	}
	return out, nil
}

// messagesForTemplate gives templates the dict shapes transformers passes:
// optional keys (name, tool_calls, tool_call_id) are absent when unset, so
// "message.tool_calls is defined" behaves.
func messagesForTemplate(messages []Message) []map[string]any {
	out := make([]map[string]any, len(messages))
	for i, m := range messages {
		d := map[string]any{"role": m.Role, "content": m.Content}
		if m.Name != "" {
			d["name"] = m.Name
		}
		if m.ToolCallID != "" {
			d["tool_call_id"] = m.ToolCallID
		}
		if len(m.ToolCalls) > 0 {
			calls := make([]map[string]any, len(m.ToolCalls))
			for k, tc := range m.ToolCalls {
				// Templates index arguments as a mapping (tojson) or print
				// it; pass parsed JSON when it parses, else the string.
				var args any = tc.Function.Arguments
				var parsed map[string]any
				if json.Unmarshal([]byte(tc.Function.Arguments), &parsed) == nil {
					args = parsed
				}
				fn := map[string]any{"name": tc.Function.Name, "arguments": args}
				calls[k] = map[string]any{"id": tc.ID, "type": tc.Type, "function": fn}
			}
			d["tool_calls"] = calls
		}
		out[i] = d
	}
	return out
}

// strftime supports the directives chat templates use for dates.
func strftime(t time.Time, f string) string {
	r := strings.NewReplacer("%Y", "2006", "%m", "01", "%d", "02", "%H", "15", "%M", "04", "%S", "05",
		"%B", "January", "%b", "Jan", "%A", "Monday", "%a", "Mon", "%y", "06", "%p", "PM", "%%", "%")
	// Escape Go layout digits in literal text is not needed for the
	// formats templates use ("%d %b %Y", "%Y-%m-%d").
	return t.Format(r.Replace(f))
}
