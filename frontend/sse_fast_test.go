package frontend

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"
)

// The hand-rendered text chunk must decode to exactly what the generic
// map-based encoding produced.
func TestTextChunkMatchesEncodingJSON(t *testing.T) {
	texts := []string{"", "plain", `quo"te\back`, "nl\nret\rtab\tnul\x00bell\x07", "<script>&amp;</script>",
		"héllo 口 🙂", "bad \xff\xfe utf8 \xe2\x82", "line\u2028sep\u2029", "\x1f\x7f"}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		b := make([]byte, rng.IntN(12))
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		texts = append(texts, string(b))
	}
	for _, chat := range []bool{true, false} {
		for _, usage := range []bool{true, false} {
			c := newStreamEvents("chatcmpl-<id>&", "chat.completion.chunk", 1700000000, "m\"odel", chat, usage)
			for _, text := range texts {
				got := c.render(text)
				want := map[string]any{"id": "chatcmpl-<id>&", "object": "chat.completion.chunk", "created": 1700000000, "model": "m\"odel"}
				choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": nil}
				if chat {
					choice["delta"] = map[string]any{"content": text}
				} else {
					choice["text"] = text
				}
				want["choices"] = []any{choice}
				if usage {
					want["usage"] = nil
				}
				wb, _ := json.Marshal(want)
				data, ok := bytes.CutPrefix(got, []byte("data: "))
				if !ok || !bytes.HasSuffix(data, []byte("\n\n")) {
					t.Fatalf("not an SSE event: %q", got)
				}
				if !sameJSON(t, data, wb) {
					t.Fatalf("text %q:\n got %s\nwant %s", text, data, wb)
				}
				// Byte-for-byte the same string escaping as encoding/json.
				sb, _ := json.Marshal(text)
				if e := appendJSONString(nil, text); !bytes.Equal(e, sb) {
					t.Fatalf("text %q escaped as %s, encoding/json %s", text, e, sb)
				}
			}
		}
	}
}

// The stream's other events match the map-based encoding too.
func TestStreamEventsMatchEncodingJSON(t *testing.T) {
	for _, chat := range []bool{true, false} {
		for _, incl := range []bool{true, false} {
			c := newStreamEvents("cmpl-<&>", "text_completion", 1700000001, "kvmesh-sim", chat, incl)
			head := func() map[string]any {
				return map[string]any{"id": "cmpl-<&>", "object": "text_completion", "created": 1700000001, "model": "kvmesh-sim"}
			}
			withUsage := func(m map[string]any) map[string]any {
				if incl {
					m["usage"] = nil
				}
				return m
			}
			check := func(name string, got []byte, want map[string]any) {
				t.Helper()
				data, ok := bytes.CutPrefix(got, []byte("data: "))
				if !ok || !bytes.HasSuffix(data, []byte("\n\n")) {
					t.Fatalf("%s: not an SSE event: %q", name, got)
				}
				wb, _ := json.Marshal(want)
				if !sameJSON(t, data, wb) {
					t.Fatalf("%s (chat %v, usage %v):\n got %s\nwant %s", name, chat, incl, data, wb)
				}
			}
			if chat {
				m := head()
				m["choices"] = []any{map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "logprobs": nil, "finish_reason": nil}}
				check("role", c.role(), withUsage(m))
			}
			for _, reason := range []string{"stop", "length", "content_filter"} {
				m := head()
				choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": reason}
				if chat {
					choice["delta"] = map[string]any{}
				} else {
					choice["text"] = ""
				}
				m["choices"] = []any{choice}
				check("finish", c.finish(reason), withUsage(m))
			}
			u := usage{PromptTokens: 1234, CompletionTokens: 56, CachedTokens: 1024}
			m := head()
			m["choices"] = []any{}
			m["usage"] = toUsage(u)
			check("usage", c.usage(u), m)
		}
	}
}

func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("invalid JSON %q: %v", a, err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatal(err)
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return bytes.Equal(xb, yb)
}

func BenchmarkTextChunk(b *testing.B) {
	c := newStreamEvents("chatcmpl-0123456789abcdef01234567", "chat.completion.chunk", 1700000000, "kvmesh-sim", true, false)
	b.ReportAllocs()
	for b.Loop() {
		c.render(" token")
	}
}

func BenchmarkTextChunkMap(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		v := map[string]any{"id": "chatcmpl-0123456789abcdef01234567", "object": "chat.completion.chunk", "created": 1700000000, "model": "kvmesh-sim",
			"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": " token"}, "logprobs": nil, "finish_reason": nil}}}
		j, _ := json.Marshal(v)
		_ = append(append([]byte("data: "), j...), "\n\n"...)
	}
}
