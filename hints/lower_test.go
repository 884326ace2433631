package hints

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden files")

// deepCopy snapshots a request body so tests can prove it was not mutated.
func deepCopy(t *testing.T, m map[string]any) map[string]any {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var out map[string]any
	if err := dec.Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// asJSON renders a body the way it goes on the wire (map keys sorted).
func asJSON(t *testing.T, m map[string]any) string {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// baseRequest carries a stale hint in every location plus unrelated fields.
func baseRequest() map[string]any {
	return map[string]any{
		"model":    "m",
		"prompt":   []any{1, 2, 3},
		"kv_hints": json.RawMessage(`{"protocol_version":"0.1","message_id":"stale","actions":[]}`),
		"kv_transfer_params": map[string]any{
			"do_remote_decode": true,
			"kv_hint":          "stale",
			"router_hint":      map[string]any{"block_hashes": []any{1}},
		},
		"sampling_params": map[string]any{"temperature": 0.5},
	}
}

func testEnvelope(t *testing.T) *Envelope {
	t.Helper()
	// One router fetch plus an unknown action that must be carried along.
	in := `{"protocol_version":"0.1","message_id":"sel-7","actions":[` +
		`{"action_id":"a1","action_type":"kv.fetch","action_version":"1.0","payload":{"source_control_endpoint":"tcp://10.0.0.7:23280","block_hashes":[11,22,18446744073709551615]}},` +
		`{"action_id":"p","action_type":"vllm.set_priority","action_version":"1.0","payload":{"value":null}}]}`
	env, err := Parse([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func TestLowerGolden(t *testing.T) {
	env := testEnvelope(t)
	for _, engine := range Engines {
		t.Run(string(engine), func(t *testing.T) {
			req := baseRequest()
			snap := deepCopy(t, req)
			out, err := Lower(engine, req, env)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(deepCopy(t, req), snap) {
				t.Fatal("Lower mutated the caller's request")
			}
			got := asJSON(t, out)
			path := filepath.Join("testdata", "golden", "lower_"+string(engine)+".json")
			if *update {
				if err := os.WriteFile(path, []byte(got+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if got+"\n" != string(want) {
				t.Errorf("lowered body\n got: %s\nwant: %s", got, want)
			}
			// The hint reads back identically from the lowered body.
			back, err := FromRequest(engine, deepCopy(t, out))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(back.Marshal(), env.Marshal()) {
				t.Errorf("read back %s\nwant %s", back.Marshal(), env.Marshal())
			}
		})
	}
}

func TestLowerNilRemovesEveryHint(t *testing.T) {
	for _, engine := range Engines {
		req := baseRequest()
		snap := deepCopy(t, req)
		out, err := Lower(engine, req, nil)
		if err != nil {
			t.Fatal(err)
		}
		want := `{"kv_transfer_params":{"do_remote_decode":true},"model":"m","prompt":[1,2,3],"sampling_params":{"temperature":0.5}}`
		if got := asJSON(t, out); got != want {
			t.Errorf("%s: got %s", engine, got)
		}
		if !reflect.DeepEqual(deepCopy(t, req), snap) {
			t.Errorf("%s: caller's request mutated", engine)
		}
		if env, err := FromRequest(engine, out); env != nil || err != nil {
			t.Errorf("%s: hint still readable: %v %v", engine, env, err)
		}
	}
}

func TestLowerBridgeCreatesParamsAndKeepsExactNumbers(t *testing.T) {
	env := NewFetch("s", "tcp://h:9", []uint64{1})
	// kv_transfer_params may arrive as raw JSON; large numbers stay exact.
	req := map[string]any{"kv_transfer_params": json.RawMessage(`{"remote_block_ids":[18446744073709551615]}`)}
	out, err := Lower(VLLMBridge, req, env)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"kv_transfer_params":{"kv_hint":` + string(env.Marshal()) + `,"remote_block_ids":[18446744073709551615]}}`
	if got := asJSON(t, out); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	out, err = Lower(VLLMBridge, nil, env)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := asJSON(t, out), `{"kv_transfer_params":{"kv_hint":`+string(env.Marshal())+`}}`; got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestLowerErrors(t *testing.T) {
	env := NewFetch("s", "tcp://h:9", []uint64{1})
	if _, err := Lower("tgi", nil, env); err == nil || err.Error() != `unknown engine "tgi"` {
		t.Errorf("got %v", err)
	}
	if _, err := Lower("tgi", nil, nil); err == nil {
		t.Error("unknown engine accepted with nil hint")
	}
	_, err := Lower(VLLMBridge, map[string]any{"kv_transfer_params": "x"}, env)
	if err == nil || err.Error() != "kv_transfer_params: must be an object, got string" {
		t.Errorf("got %v", err)
	}
	_, err = Lower(VLLM, map[string]any{"kv_transfer_params": json.RawMessage(`[1]`)}, env)
	if err == nil || err.Error() != "kv_transfer_params: must be an object, got list" {
		t.Errorf("got %v", err)
	}
	if _, err := ParseEngine("sglang"); err != nil {
		t.Error(err)
	}
	if _, err := ParseEngine("SGLang"); err == nil {
		t.Error("engine names are exact")
	}
}

func TestInstallConnectorParams(t *testing.T) {
	extra := map[string]any{
		"kv_transfer_params": map[string]any{"untrusted": "caller key", "kv_hint": "x"},
		"unrelated":          map[string]any{"keep": 1},
	}
	params := map[string]any{"remote_engine_id": "e1", "remote_block_ids": []any{4, 5}, "kv_hint": "must go", "router_hint": "must go"}
	extraSnap, paramsSnap := deepCopy(t, extra), deepCopy(t, params)

	out := InstallConnectorParams(extra, params)
	want := `{"kv_transfer_params":{"remote_block_ids":[4,5],"remote_engine_id":"e1"},"unrelated":{"keep":1}}`
	if got := asJSON(t, out); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if !reflect.DeepEqual(deepCopy(t, extra), extraSnap) || !reflect.DeepEqual(deepCopy(t, params), paramsSnap) {
		t.Error("caller's maps mutated")
	}
	// Later edits to the result do not reach the caller's params.
	out["kv_transfer_params"].(map[string]any)["added"] = true
	if _, ok := params["added"]; ok {
		t.Error("result aliases caller's params")
	}
	if got := asJSON(t, InstallConnectorParams(extra, nil)); got != `{"unrelated":{"keep":1}}` {
		t.Errorf("nil params: %s", got)
	}
	if got := asJSON(t, InstallConnectorParams(nil, map[string]any{"a": 1})); got != `{"kv_transfer_params":{"a":1}}` {
		t.Errorf("nil extra: %s", got)
	}
}

func TestPrefillLeg(t *testing.T) {
	env := NewFetch("sel", "tcp://10.0.0.7:1", []uint64{7})
	cases := []struct {
		engine  Engine
		req     map[string]any
		refused bool
	}{
		{VLLM, map[string]any{"kv_transfer_params": map[string]any{"do_remote_decode": true}}, false},
		{VLLMBridge, map[string]any{"kv_transfer_params": map[string]any{"do_remote_decode": true}}, false},
		{VLLM, map[string]any{"kv_transfer_params": map[string]any{"do_remote_prefill": true, "remote_block_ids": []any{1}}}, true},
		{VLLMBridge, map[string]any{"kv_transfer_params": json.RawMessage(`{"do_remote_prefill":true}`)}, true},
		{TRTLLM, map[string]any{"disaggregated_params": map[string]any{"request_type": "context_only"}}, false},
		{TRTLLM, map[string]any{"disaggregated_params": map[string]any{"request_type": "generation_only", "opaque_state": "AAA="}}, true},
		{SGLang, map[string]any{"bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": 2}, false},
		{VLLM, map[string]any{}, false}, // aggregated
	}
	for i, c := range cases {
		snap := deepCopy(t, c.req)
		out, err := PrefillLeg(c.engine, c.req, env)
		if c.refused {
			if !errors.Is(err, ErrDecodeLeg) || out != nil {
				t.Errorf("case %d (%s): got %v, want ErrDecodeLeg", i, c.engine, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		got, err := FromRequest(c.engine, out)
		if err != nil || got == nil {
			t.Fatalf("case %d (%s): hint not carried: %v", i, c.engine, err)
		}
		if !reflect.DeepEqual(deepCopy(t, c.req), snap) {
			t.Errorf("case %d: caller's request mutated", i)
		}
	}
}

func TestDecodeLegNeverReplaysHint(t *testing.T) {
	env := NewFetch("sel", "tcp://10.0.0.7:1", []uint64{7})
	// The decode request as the frontend built it: it carries the request's
	// hint in every form, a caller kv_transfer_params, and unrelated fields.
	mk := func(engine Engine) map[string]any {
		req := map[string]any{"model": "m", "max_tokens": 16, "kv_transfer_params": map[string]any{"caller": "x"}}
		out, err := Lower(engine, req, env)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	prefillParams := map[string]any{"do_remote_prefill": true, "remote_engine_id": "p0", "remote_block_ids": []any{3, 4}, "kv_hint": env}
	cases := []struct {
		engine  Engine
		handoff map[string]any
		want    string
	}{
		{VLLM, prefillParams, `{"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[3,4],"remote_engine_id":"p0"},"max_tokens":16,"model":"m"}`},
		{VLLMBridge, prefillParams, `{"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[3,4],"remote_engine_id":"p0"},"max_tokens":16,"model":"m"}`},
		{TRTLLM, map[string]any{"request_type": "generation_only", "opaque_state": "AAA=", "kv_hint": env},
			`{"disaggregated_params":{"opaque_state":"AAA=","request_type":"generation_only"},"kv_transfer_params":{"caller":"x"},"max_tokens":16,"model":"m"}`},
		{SGLang, map[string]any{"bootstrap_host": "10.0.0.9", "bootstrap_port": 8998, "bootstrap_room": 12},
			`{"bootstrap_host":"10.0.0.9","bootstrap_port":8998,"bootstrap_room":12,"kv_transfer_params":{"caller":"x"},"max_tokens":16,"model":"m"}`},
	}
	for _, c := range cases {
		t.Run(string(c.engine), func(t *testing.T) {
			req := mk(c.engine)
			reqSnap, handSnap := deepCopy(t, req), deepCopy(t, c.handoff)
			out, err := DecodeLeg(c.engine, req, c.handoff)
			if err != nil {
				t.Fatal(err)
			}
			if got := asJSON(t, out); got != c.want {
				t.Errorf("got  %s\nwant %s", got, c.want)
			}
			if h, err := FromRequest(c.engine, out); h != nil || err != nil {
				t.Errorf("decode leg still carries a hint: %v %v", h, err)
			}
			if !reflect.DeepEqual(deepCopy(t, req), reqSnap) || !reflect.DeepEqual(deepCopy(t, c.handoff), handSnap) {
				t.Error("caller's maps mutated")
			}
			// The decode request is now a recognised handoff (SGLang excepted).
			if c.engine != SGLang && !IsDecodeHandoff(c.engine, out) {
				t.Error("decode leg not recognised as a handoff")
			}
			if _, err := PrefillLeg(c.engine, out, env); c.engine != SGLang && !errors.Is(err, ErrDecodeLeg) {
				t.Errorf("PrefillLeg on a decode leg: %v", err)
			}
		})
	}
	if _, err := DecodeLeg(SGLang, nil, map[string]any{"kv_transfer_params": 1}); err == nil ||
		err.Error() != `sglang decode handoff: unexpected key "kv_transfer_params" (want bootstrap_host, bootstrap_port, bootstrap_room)` {
		t.Errorf("got %v", err)
	}
	if _, err := DecodeLeg("tgi", nil, nil); err == nil {
		t.Error("unknown engine accepted")
	}
}

func TestFromRequestCompactRouterHint(t *testing.T) {
	req := map[string]any{"kv_transfer_params": map[string]any{
		"router_hint": json.RawMessage(`{"source_control_endpoint":"tcp://10.0.0.1:5","block_hashes":[18446744073709551615]}`),
	}}
	env, err := FromRequest(VLLMBridge, req)
	if err != nil {
		t.Fatal(err)
	}
	f, ok := env.Fetch()
	if !ok || f.SourceEndpoint != "tcp://10.0.0.1:5" || f.BlockHashes[0] != math.MaxUint64 {
		t.Errorf("got %+v", f)
	}
	// A generic decode with UseNumber also works (json.Number values).
	dec := json.NewDecoder(bytes.NewReader([]byte(`{"kv_hints":` + string(env.Marshal()) + `}`)))
	dec.UseNumber()
	var body map[string]any
	if err := dec.Decode(&body); err != nil {
		t.Fatal(err)
	}
	back, err := FromRequest(VLLM, body)
	if err != nil || !bytes.Equal(back.Marshal(), env.Marshal()) {
		t.Errorf("got %v %v", back, err)
	}
	_, err = ParseCompact([]byte(`{"block_hashes":[]}`))
	if err == nil || err.Error() != "router_hint.block_hashes: must not be empty" {
		t.Errorf("got %v", err)
	}
	_, err = ParseCompact([]byte(`{"block_hashes":[1]} x`))
	if err == nil || err.Error() != "router_hint: unexpected data after the JSON value" {
		t.Errorf("got %v", err)
	}
	_, err = FromRequest(VLLM, map[string]any{"kv_hints": json.RawMessage(`{"protocol_version":"0.1"}`)})
	if err == nil || err.Error() != "message_id: missing" {
		t.Errorf("got %v", err)
	}
}
