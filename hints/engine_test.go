package hints

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden files")

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

func TestEncodeGolden(t *testing.T) {
	env := testEnvelope(t)
	for _, engine := range Engines() {
		t.Run(string(engine), func(t *testing.T) {
			got, err := Encode(engine, env)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", "golden", "encode_"+string(engine)+".json")
			if *update {
				if err := os.WriteFile(path, append(bytes.Clone(got), '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if string(got)+"\n" != string(want) {
				t.Errorf("wire form\n got: %s\nwant: %s", got, want)
			}
			// Every form parses back to the same envelope.
			back, err := Parse(got)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(back.Marshal(), env.Marshal()) {
				t.Errorf("read back %s\nwant %s", back.Marshal(), env.Marshal())
			}
		})
	}
}

func TestEngineNames(t *testing.T) {
	for _, e := range Engines() {
		if got, err := ParseEngine(string(e)); err != nil || got != e {
			t.Errorf("ParseEngine(%q) = %q, %v", e, got, err)
		}
	}
	if _, err := ParseEngine("SGLang"); err == nil {
		t.Error("engine names are exact")
	}
	if _, err := ParseEngine("tgi"); err == nil || err.Error() != `unknown engine "tgi" (want vllm, vllm-bridge, sglang or trtllm)` {
		t.Errorf("got %v", err)
	}
	if _, err := Encode("tgi", NewFetch("s", "tcp://h:9", []uint64{1})); err == nil || err.Error() != `unknown engine "tgi"` {
		t.Errorf("got %v", err)
	}
}
