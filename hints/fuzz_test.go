package hints

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

// FuzzParse: Parse never panics; a Parser (the serving entry) agrees with it;
// anything accepted marshals to valid JSON that parses back to the same
// envelope (Marshal is a fixed point), and every engine's wire form (Encode)
// reads back unchanged.
// Seeds live in testdata/fuzz/FuzzParse plus the ones added here.
func FuzzParse(f *testing.F) {
	f.Add([]byte(withPayload(`{"source_control_endpoint":"tcp://127.0.0.1:23280","block_hashes":[11,22]}`)))
	f.Add([]byte(withPayload(`{"block_hashes":[18446744073709551615],"no_retain":true,"mode":"copy"}`)))
	f.Add([]byte(withAction(`{"action_id":"x","action_type":"kv.future_action","action_version":"7.3","payload":{"a":[1e400]}}`)))
	f.Add([]byte(withAction(`{"action_id":"a","action_type":"kv.source_locations","action_version":"1.0","payload":{"block_hashes":[1]}}`)))
	f.Add([]byte(`{"protocol_version":"0.2","message_id":"m","actions":[]}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkSplitters(t, data)
		env, err := Parse(data)
		venv, verr := NewParser(nil).Parse(data)
		if (err == nil) != (verr == nil) || (err != nil && err.Error() != verr.Error()) || !reflect.DeepEqual(env, venv) {
			t.Fatalf("Parse and a Parser disagree: %v / %v", err, verr)
		}
		if err != nil {
			if env != nil {
				t.Fatal("envelope returned with an error")
			}
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		out := env.Marshal()
		if !json.Valid(out) {
			t.Fatalf("Marshal produced invalid JSON: %s", out)
		}
		again, err := Parse(out)
		if err != nil {
			t.Fatalf("re-parse of %s failed: %v", out, err)
		}
		if !reflect.DeepEqual(env, again) {
			t.Fatalf("re-parsed envelope differs\nfirst:  %#v\nsecond: %#v", env, again)
		}
		if out2 := again.Marshal(); !bytes.Equal(out, out2) {
			t.Fatalf("Marshal not a fixed point\n%s\n%s", out, out2)
		}
		for _, engine := range Engines() {
			wire, err := Encode(engine, env)
			if err != nil {
				t.Fatalf("%s: %v", engine, err)
			}
			back, err := Parse(wire)
			if err != nil {
				t.Fatalf("%s: read back: %v", engine, err)
			}
			if !bytes.Equal(back.Marshal(), out) {
				t.Fatalf("%s: read back differs\n%s\n%s", engine, back.Marshal(), out)
			}
		}
	})
}

// checkSplitters compares the trusted splitters with encoding/json on any
// valid JSON object or list.
func checkSplitters(t *testing.T, data []byte) {
	if !json.Valid(data) {
		return
	}
	switch kind(data) {
	case "object":
		want := map[string]json.RawMessage{}
		if err := json.Unmarshal(data, &want); err != nil {
			return
		}
		got, err := splitObject(data)
		if errors.Is(err, errDuplicateKey) && hasDuplicateKey(data) {
			return
		}
		if err != nil || !reflect.DeepEqual(normRaw(got), normRaw(want)) {
			t.Fatalf("splitObject(%q) = %q, %v; want %q", data, got, err, want)
		}
	case "list":
		var want []json.RawMessage
		if err := json.Unmarshal(data, &want); err != nil {
			return
		}
		got, err := splitList(data)
		if err != nil || len(got) != len(want) {
			t.Fatalf("splitList(%q) = %q, %v; want %q", data, got, err, want)
		}
		for i := range got {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("splitList(%q)[%d] = %q; want %q", data, i, got[i], want[i])
			}
		}
	}
}

func normRaw(m map[string]json.RawMessage) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = string(v)
	}
	return out
}

// hasDuplicateKey reports whether the top-level object of data repeats a key.
func hasDuplicateKey(data []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(data))
	if _, err := dec.Token(); err != nil { // {
		return false
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		key, _ := tok.(string)
		if seen[key] {
			return true
		}
		seen[key] = true
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return false
		}
	}
	return false
}
