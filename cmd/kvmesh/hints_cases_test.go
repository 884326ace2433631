package main

import (
	"errors"
	"testing"

	"github.com/kvmesh/kvmesh/hints"
)

// Every kind of malformed hint KVCR's parser rejects (research/kvcr_hints.md
// §2.5), plus kvmesh's stricter endpoint rules, is rejected by `kvmesh hints
// validate` with its precise message and nothing on stdout.
func TestHintsValidateMalformedCases(t *testing.T) {
	const ep = `"source_control_endpoint":"tcp://10.0.0.7:23280"`
	payload := func(p string) string {
		return `{"protocol_version":"0.1","message_id":"m","actions":[{"action_id":"a1","action_type":"kv.fetch","action_version":"1.0","payload":` + p + `}]}`
	}
	for _, c := range []struct{ name, in, want string }{
		{"envelope not a mapping", `[]`, "envelope: must be an object, got list"},
		{"invalid JSON", `{"protocol_version":`, "envelope: invalid JSON: unexpected EOF"},
		{"actions missing", `{"protocol_version":"0.1","message_id":"m"}`, "actions: missing"},
		{"actions not a list", `{"protocol_version":"0.1","message_id":"m","actions":{}}`, "actions: must be a list, got object"},
		{"fetch payload not a mapping", payload(`"tcp://h:1"`), "actions[0].payload: must be an object, got string"},
		{"endpoint not a string", payload(`{"source_control_endpoint":5,"block_hashes":[1]}`), "actions[0].payload.source_control_endpoint: must be a non-empty tcp://host:port string, got number"},
		{"endpoint empty", payload(`{"source_control_endpoint":"","block_hashes":[1]}`), "actions[0].payload.source_control_endpoint: endpoint is empty, want tcp://host:port"},
		{"endpoint wildcard", payload(`{"source_control_endpoint":"tcp://0.0.0.0:80","block_hashes":[1]}`), `actions[0].payload.source_control_endpoint: endpoint "tcp://0.0.0.0:80": host "0.0.0.0": wildcard address is bind-only and cannot be advertised`},
		{"endpoint IPv6 unbracketed", payload(`{"source_control_endpoint":"tcp://fd00::1:80","block_hashes":[1]}`), `actions[0].payload.source_control_endpoint: endpoint "tcp://fd00::1:80": IPv6 host must be bracketed, as in tcp://[::1]:9000`},
		{"block_hashes not a list", payload(`{` + ep + `,"block_hashes":"1,2"}`), "actions[0].payload.block_hashes: must be a list of integers, got string"},
		{"block_hashes empty", payload(`{` + ep + `,"block_hashes":[]}`), "actions[0].payload.block_hashes: must not be empty"},
		{"hash bool", payload(`{` + ep + `,"block_hashes":[true]}`), "actions[0].payload.block_hashes[0]: must be an integer in [0, 2^64), got true"},
		{"hash not an int", payload(`{` + ep + `,"block_hashes":[1.5]}`), "actions[0].payload.block_hashes[0]: must be an integer in [0, 2^64), got 1.5"},
		{"hash negative", payload(`{` + ep + `,"block_hashes":[1,2,3,-1]}`), "actions[0].payload.block_hashes[3]: must be an integer in [0, 2^64), got -1"},
		{"hash ≥ 2^64", payload(`{` + ep + `,"block_hashes":[18446744073709551616]}`), "actions[0].payload.block_hashes[0]: must be an integer in [0, 2^64), got 18446744073709551616"},
		{"mode not a string", payload(`{` + ep + `,"block_hashes":[1],"mode":1}`), `actions[0].payload.mode: must be "copy" or "move", got 1`},
		{"mode unknown", payload(`{` + ep + `,"block_hashes":[1],"mode":"fast"}`), `actions[0].payload.mode: must be "copy" or "move", got "fast"`},
		{"mode move", payload(`{` + ep + `,"block_hashes":[1],"mode":"move"}`), `actions[0].payload.mode: "move" is not supported (only "copy")`},
		{"no_retain not a bool", payload(`{` + ep + `,"block_hashes":[1],"no_retain":"yes"}`), `actions[0].payload.no_retain: must be a bool, got "yes"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := runHints(t, c.in, "validate")
			if out != "" {
				t.Errorf("printed %q for a malformed hint", out)
			}
			if err == nil || err.Error() != c.want || !errors.Is(err, hints.ErrMalformed) {
				t.Errorf("got %v\nwant %s", err, c.want)
			}
		})
	}
}
