package frontend

import (
	"net/http"
	"testing"
)

// FuzzParse: any body gets a validated request or a 4xx error, never a panic.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stop":["a"],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"max_tokens":3,"seed":-1}`,
		`{"model":"m","prompt":[[1,2],[3]],"temperature":0.5,"top_p":1,"n":1}`,
		`{"model":"m","prompt":["a","b"],"echo":true}`,
		`{"model":"m","prompt":[1e3]}`, `[]`, `{`, `null`, `{"model":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if r, err := parseChat(body); err != nil {
			if err.Status != http.StatusBadRequest || err.Message == "" {
				t.Fatalf("chat: %d %q", err.Status, err.Message)
			}
		} else if r.Model == "" || len(r.Messages) == 0 {
			t.Fatalf("chat accepted without model or messages: %q", body)
		}
		if r, err := parseCompletion(body); err != nil {
			if err.Status != http.StatusBadRequest || err.Message == "" {
				t.Fatalf("completion: %d %q", err.Status, err.Message)
			}
		} else if r.Model == "" || len(r.Texts)+len(r.TokenPrompts) == 0 {
			t.Fatalf("completion accepted without model or prompt: %q", body)
		}
	})
}
