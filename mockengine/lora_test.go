package mockengine

import (
	"net/http"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

// A LoRA adapter (--lora-modules) is served under its own name, as vLLM
// does: its requests compute in the adapter's hash domain, so the same
// prompt shares nothing with the base model or another adapter and shares
// with itself; /v1/models lists it with its parent; an unknown name is 404.
func TestLoRAModules(t *testing.T) {
	v, url := startVLLM(t, VLLMConfig{LoRAs: []string{"sql-lora", "chat-lora"}})
	prompt := seqTokens(72, 5) // 4 full blocks and a tail
	cached := func(model string) int {
		t.Helper()
		code, b := post(t, url+"/v1/completions", map[string]any{"model": model, "prompt": prompt, "max_tokens": 1}, nil)
		if code != http.StatusOK {
			t.Fatalf("%s: %d %s", model, code, b)
		}
		c := decode[completion](t, b)
		if c.Model != model {
			t.Fatalf("answered as %q, want %q", c.Model, model)
		}
		return c.Usage.PromptTokensDetails.CachedTokens
	}
	if n := cached(testModel); n != 0 {
		t.Fatalf("base model, first: %d cached", n)
	}
	if n := cached("sql-lora"); n != 0 {
		t.Fatalf("sql-lora after the base model: %d cached tokens", n)
	}
	if n := cached("chat-lora"); n != 0 {
		t.Fatalf("chat-lora after sql-lora: %d cached tokens", n)
	}
	if n := cached("sql-lora"); n != 64 {
		t.Fatalf("sql-lora again: %d cached, want 64", n)
	}
	_, seq := kv.NewHasher(16, "sql-lora", "").Blocks(prompt)
	if d, ok := v.Engine().BlockDomain(seq[0]); !ok || d != kv.Seed("sql-lora", "") {
		t.Fatalf("sql-lora's first block: domain %x (held %v)", d, ok)
	}
	code, b := post(t, url+"/v1/completions", map[string]any{"model": "other-lora", "prompt": prompt, "max_tokens": 1}, nil)
	if code != http.StatusNotFound || !strings.Contains(string(b), "other-lora") {
		t.Fatalf("unknown adapter: %d %s", code, b)
	}
	_, b = get(t, url+"/v1/models")
	for _, want := range []string{`"id":"sql-lora"`, `"id":"chat-lora"`, `"parent":"` + testModel + `"`} {
		if !strings.Contains(string(b), want) {
			t.Fatalf("/v1/models lacks %s: %s", want, b)
		}
	}
}
