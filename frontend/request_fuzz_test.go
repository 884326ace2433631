package frontend

import (
	"encoding/json"
	"math"
	"net/http"
	"reflect"
	"testing"
)

// FuzzParse: any body gets a validated request or a 4xx error, never a
// panic, and what is accepted holds only well-typed, in-range parameters:
// no number in a string, no feature kvmesh would silently ignore.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stop":["a"],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"max_tokens":3,"seed":-1}`,
		`{"model":"m","prompt":[[1,2],[3]],"temperature":0.5,"top_p":1,"n":1}`,
		`{"model":"m","prompt":["a","b"],"echo":true}`,
		`{"model":"m","prompt":[1e3]}`, `[]`, `{`, `null`, `{"model":null}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":"4"}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":9223372036854775808,"min_tokens":1}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"presence_penalty":1.5,"frequency_penalty":-2,"logprobs":false,"top_logprobs":null}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}],"tool_choice":"none","response_format":{"type":"text"}}`,
		`{"model":"m","messages":[{"role":"tool","content":"1","tool_call_id":"c"}],"store":true,"metadata":{"a":"b"},"service_tier":"auto","parallel_tool_calls":false}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"logit_bias":{"1":-100},"seed":1e2}`,
		`{"model":"m","prompt":"a","best_of":1,"logprobs":null,"suffix":""}`,
		`{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"a\nb","name":"n"},{"role":"assistant","content":null}]}`,
		`{"model":"m","messages":[{"role":"bad","content":"x"},1]}`,
		`{"model":"m","messages":[{"role":"user","content":"x","content":[{"type":"text","text":"y"}]}],"messages":[{"role":"user","content":"z"}]}`,
	} {
		f.Add([]byte(s))
	}
	ints := []string{"max_tokens", "max_completion_tokens", "min_tokens", "seed", "n", "top_logprobs", "best_of", "logprobs"}
	nums := map[string][2]float64{"temperature": {0, 2}, "top_p": {0, 1}, "presence_penalty": {-2, 2}, "frequency_penalty": {-2, 2}}
	// accepted checks what the parser let through against encoding/json.
	accepted := func(t *testing.T, body []byte, chat bool) {
		var top map[string]json.RawMessage
		if err := json.Unmarshal(body, &top); err != nil {
			t.Fatalf("accepted a body encoding/json rejects: %q", body)
		}
		for _, k := range ints {
			if k == "logprobs" && chat {
				continue
			}
			if v, ok := top[k]; ok && !isNull(v) {
				var x float64
				if err := json.Unmarshal(v, &x); err != nil || x != math.Trunc(x) {
					t.Fatalf("accepted %s = %s, not an integer: %q", k, v, body)
				}
			}
		}
		for k, r := range nums {
			if v, ok := top[k]; ok && !isNull(v) {
				var x float64
				if err := json.Unmarshal(v, &x); err != nil || x < r[0] || x > r[1] {
					t.Fatalf("accepted %s = %s: %q", k, v, body)
				}
			}
		}
		for _, k := range []string{"stream", "store", "parallel_tool_calls", "echo"} {
			if v, ok := top[k]; ok && !isNull(v) {
				var b bool
				if err := json.Unmarshal(v, &b); err != nil {
					t.Fatalf("accepted %s = %s: %q", k, v, body)
				}
			}
		}
		if !chat {
			if v, ok := top["logprobs"]; ok && !isNull(v) {
				t.Fatalf("accepted completion logprobs %s: %q", v, body)
			}
			return
		}
		if v, ok := top["logprobs"]; ok && string(v) != "false" && !isNull(v) {
			t.Fatalf("accepted logprobs %s: %q", v, body)
		}
		var tools []json.RawMessage
		if json.Unmarshal(top["tools"], &tools) == nil && len(tools) > 0 && string(top["tool_choice"]) != `"none"` {
			t.Fatalf("accepted tools without tool_choice none: %q", body)
		}
		if v, ok := top["response_format"]; ok && !isNull(v) {
			var rf struct{ Type string }
			if json.Unmarshal(v, &rf) != nil || rf.Type != "text" {
				t.Fatalf("accepted response_format %s: %q", v, body)
			}
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r1, e1 := parseChatWith(body, true)
		r2, e2 := parseChatWith(body, false)
		if !reflect.DeepEqual(parsed(r1), parsed(r2)) || !reflect.DeepEqual(e1, e2) {
			t.Fatalf("chat %q: the one-pass split gives %+v, %+v; the general path %+v, %+v", body, r1, e1, r2, e2)
		}
		if r, err := parseChat(body); err != nil {
			if err.Status != http.StatusBadRequest || err.Message == "" {
				t.Fatalf("chat: %d %q", err.Status, err.Message)
			}
		} else if r.Model == "" || len(r.Messages) == 0 {
			t.Fatalf("chat accepted without model or messages: %q", body)
		} else {
			accepted(t, body, true)
		}
		if r, err := parseCompletion(body); err != nil {
			if err.Status != http.StatusBadRequest || err.Message == "" {
				t.Fatalf("completion: %d %q", err.Status, err.Message)
			}
		} else if r.Model == "" || len(r.Texts)+len(r.TokenPrompts) == 0 {
			t.Fatalf("completion accepted without model or prompt: %q", body)
		} else {
			accepted(t, body, false)
		}
	})
}
