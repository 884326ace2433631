package hints

import (
	"encoding/json"
	"testing"
)

// The seed's fixture (vLLM's envelope builder test): action_id 123 is the
// action "123", as Python's str() makes it; the action is still a kv.fetch
// and is sent on with the string.
func TestNumericActionFieldsCoercedLikePythonStr(t *testing.T) {
	in := withAction(`{"action_id":123,"action_type":"kv.fetch","action_version":1.0,"payload":{"source_control_endpoint":"tcp://127.0.0.1:23280","block_hashes":[7]}}`)
	env, err := Parse([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	a := env.Actions[0]
	if a.ID != "123" || a.Type != ActionFetch || a.Version != FetchVersion {
		t.Fatalf("action %q %q %q, want \"123\" %q %q", a.ID, a.Type, a.Version, ActionFetch, FetchVersion)
	}
	if f, ok := env.Fetch(); !ok || len(f.BlockHashes) != 1 {
		t.Fatalf("fetch %+v %v: the coerced action is not read as kv.fetch", f, ok)
	}
	out, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"protocol_version":"0.1","message_id":"m","actions":[{"action_id":"123","action_type":"kv.fetch","action_version":"1.0","payload":{"source_control_endpoint":"tcp://127.0.0.1:23280","block_hashes":[7]}}]}`
	if string(out) != want {
		t.Errorf("marshalled\n%s\nwant\n%s", out, want)
	}
}

// Each literal's text is what CPython 3.12 prints for str(json.loads(lit)).
func TestPythonNumberString(t *testing.T) {
	for lit, want := range map[string]string{
		"123": "123", "-0": "0", "0": "0", "-17": "-17",
		"123456789012345678901234567890": "123456789012345678901234567890",
		"1.0":                            "1.0", "1E3": "1000.0", "1e16": "1e+16", "1.5e16": "1.5e+16",
		"1e-5": "1e-05", "0.0001": "0.0001", "1e-4": "0.0001", "0.1": "0.1",
		"123456789012345678.0": "1.2345678901234568e+17", "-0.0": "-0.0",
		"12345.678": "12345.678", "9999999999999998.0": "9999999999999998.0",
		"1e22": "1e+22", "5e-324": "5e-324", "1.7976931348623157e308": "1.7976931348623157e+308",
		"-12.5e-7": "-1.25e-06",
	} {
		got, err := pythonNumberString(lit)
		if err != nil || got != want {
			t.Errorf("%s: %q %v, want %q", lit, got, err, want)
		}
	}
	for _, lit := range []string{"1e400", "-1e400"} {
		if got, err := pythonNumberString(lit); err == nil {
			t.Errorf("%s: %q, want an error (json.loads gives inf)", lit, got)
		}
	}
}
