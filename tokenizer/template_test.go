package tokenizer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestBuiltinChatML(t *testing.T) {
	tok, tmpl, err := Builtin()
	if err != nil {
		t.Fatal(err)
	}
	msgs := []Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"}}
	got, err := tmpl.Render(msgs, true)
	if err != nil {
		t.Fatal(err)
	}
	want := "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
	if got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	ids := tok.EncodeWithSpecial(got)
	if ids[0] != O200kImStart || ids[len(ids)-1] != 198 /* "\n" */ {
		t.Errorf("ids %v", ids)
	}
	if _, err := tmpl.Render([]Message{{Role: ""}}, false); err == nil {
		t.Error("empty role accepted")
	}
	tc, err := tmpl.Render([]Message{{Role: "assistant", ToolCalls: []ToolCall{{ID: "c1", Type: "function", Function: FunctionCall{Name: "f", Arguments: `{"x":1}`}}}}}, false)
	if err != nil || !strings.Contains(tc, `<tool_call>{"arguments":{"x":1},"name":"f"}</tool_call>`) {
		t.Errorf("tool call render %q, %v", tc, err)
	}
}

func TestLoadHFWithConfig(t *testing.T) {
	tok, tmpl, err := LoadHF(filepath.Join("testdata", "tiny", "tokenizer.json"), filepath.Join("testdata", "tiny", "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := tmpl.Render([]Message{{Role: "user", Content: "  the cat \n"}}, true)
	if err != nil {
		t.Fatal(err)
	}
	want := "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nthe cat<|im_end|>\n<|im_start|>assistant\n"
	if got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	ids := tok.EncodeWithSpecial(got)
	if ids[0] != 271 || tok.Decode(ids) != want {
		t.Errorf("ids %v", ids)
	}
	if j := tmpl.(*JinjaTemplate); j.eosToken != "<|im_end|>" || j.bosToken != "" {
		t.Errorf("bos %q eos %q", j.bosToken, j.eosToken)
	}
}

// Templates in the style of real models, exercising the Jinja features they use.
const (
	// Llama-2/Mistral style: alternation check with raise_exception, bos/eos, strip().
	tmplAlternate = `{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'].strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'].strip() + eos_token }}{% endif %}{% endfor %}`

	// Llama-3 style: system split off with messages[1:], loop.first, namespace, trim filter.
	tmplLlama3 = `{%- set ns = namespace(found=false) -%}
{%- if messages[0]['role'] == 'system' -%}
{%- set system = messages[0]['content'] -%}{%- set loop_messages = messages[1:] -%}{%- set ns.found = true -%}
{%- else -%}{%- set system = 'default system' -%}{%- set loop_messages = messages -%}
{%- endif -%}
{{- bos_token -}}
{{- '<|start_header_id|>system<|end_header_id|>\n\n' + system | trim + '<|eot_id|>' -}}
{%- for message in loop_messages -%}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' -}}
{%- if loop.last and ns.found -%}{{- '[had system]' -}}{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}`

	// Qwen style tool calls: "is defined", tojson, names, startswith, loop.last, range.
	tmplTools = `{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls is defined %}
<|im_start|>assistant
{%- for tc in message.tool_calls %}
<tool_call>{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}</tool_call>
{%- endfor %}<|im_end|>
{%- elif message.role == "tool" %}
<|im_start|>user
<tool_response>{{ message.content }}</tool_response><|im_end|>
{%- else %}
<|im_start|>{{ message.role }}{% if message.name is defined %} ({{ message.name }}){% endif %}
{{ message.content }}{% if message.content.startswith('/') %} [command]{% endif %}<|im_end|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{%- for i in range(2) %}{{ i }}{% endfor %}
{%- endif %}`
)

func TestJinjaFeatures(t *testing.T) {
	defer goleak.VerifyNone(t)
	alt, err := ParseChatTemplate(tmplAlternate, "<s>", "</s>")
	if err != nil {
		t.Fatal(err)
	}
	got, err := alt.Render([]Message{{Role: "user", Content: " hi "}, {Role: "assistant", Content: "hello\n"}, {Role: "user", Content: "bye"}}, false)
	if want := "<s>[INST] hi [/INST] hello</s>[INST] bye [/INST]"; err != nil || got != want {
		t.Errorf("alternate: got %q, %v; want %q", got, err, want)
	}
	_, err = alt.Render([]Message{{Role: "user", Content: "a"}, {Role: "user", Content: "b"}}, false)
	if !errors.Is(err, ErrTemplate) || !strings.Contains(err.Error(), "must alternate") {
		t.Errorf("raise_exception: got %v", err)
	}

	l3, err := ParseChatTemplate(tmplLlama3, "<|begin_of_text|>", "<|eot_id|>")
	if err != nil {
		t.Fatal(err)
	}
	got, err = l3.Render([]Message{{Role: "system", Content: " sys "}, {Role: "user", Content: "q"}}, true)
	want := "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nsys<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nq<|eot_id|>[had system]<|start_header_id|>assistant<|end_header_id|>\n\n"
	if err != nil || got != want {
		t.Errorf("llama3: got %q, %v\nwant %q", got, err, want)
	}
	got, err = l3.Render([]Message{{Role: "user", Content: "q"}}, false)
	want = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\ndefault system<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nq<|eot_id|>"
	if err != nil || got != want {
		t.Errorf("llama3 no system: got %q, %v\nwant %q", got, err, want)
	}

	tools, err := ParseChatTemplate(tmplTools, "", "<|im_end|>")
	if err != nil {
		t.Fatal(err)
	}
	got, err = tools.Render([]Message{
		{Role: "user", Name: "ann", Content: "/weather"},
		{Role: "assistant", ToolCalls: []ToolCall{{ID: "1", Type: "function", Function: FunctionCall{Name: "get", Arguments: `{"n":[1,2.5,"<&é>"],"city":"Paris"}`}}}},
		{Role: "tool", Content: "sunny"},
	}, true)
	// trim_blocks eats the newline after each block tag, as in transformers.
	want = "<|im_start|>user (ann)/weather [command]<|im_end|><|im_start|>assistant<tool_call>{\"name\": \"get\", \"arguments\": {\"city\": \"Paris\", \"n\": [1, 2.5, \"<&é>\"]}}</tool_call><|im_end|><|im_start|>user\n<tool_response>sunny</tool_response><|im_end|><|im_start|>assistant01"
	if err != nil || got != want {
		t.Errorf("tools: got %q, %v\nwant %q", got, err, want)
	}
}

func TestChatTemplateConfigForms(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := writeFile(p, body); err != nil {
			t.Fatal(err)
		}
		return p
	}
	named := write("named.json", `{"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
		"chat_template": [{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"}]}`)
	tm, err := LoadChatTemplate(named)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := tm.Render([]Message{{Role: "user", Content: "x"}}, false); err != nil || got != "<s>x</s>" {
		t.Errorf("named form: %q, %v", got, err)
	}
	for name, body := range map[string]string{
		"none.json":   `{"eos_token": "</s>"}`,
		"empty.json":  `{"chat_template": []}`,
		"badtok.json": `{"chat_template": "x", "bos_token": 3}`,
		"syntax.json": `{"chat_template": "{% for %}"}`,
		"json.json":   `{`,
	} {
		if _, err := LoadChatTemplate(write(name, body)); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}

func writeFile(p, body string) error { return os.WriteFile(p, []byte(body), 0o644) }

// TestConcurrentUse: tokenizers and templates are shared by all requests.
func TestConcurrentUse(t *testing.T) {
	tok := builtinBPE(t)
	tmpl, err := ParseChatTemplate(tmplAlternate, "<s>", "</s>")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 4)
	for g := 0; g < 4; g++ {
		go func() {
			for i := 0; i < 50; i++ {
				s, err := tmpl.Render([]Message{{Role: "user", Content: "hi"}}, true)
				if err != nil || s != "<s>[INST] hi [/INST]" {
					done <- fmt.Errorf("render %q %v", s, err)
					return
				}
				if _, err := tmpl.Render([]Message{{Role: "assistant", Content: "x"}}, true); !errors.Is(err, ErrTemplate) {
					done <- fmt.Errorf("want ErrTemplate, got %v", err)
					return
				}
				if tok.Decode(tok.Encode("hello world 😀")) != "hello world 😀" {
					done <- errors.New("round trip")
					return
				}
			}
			done <- nil
		}()
	}
	for g := 0; g < 4; g++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
