package hints

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"reflect"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// withPayload wraps a kv.fetch payload into an otherwise valid envelope.
func withPayload(payload string) string {
	return `{"protocol_version":"0.1","message_id":"m","actions":[{"action_id":"a1","action_type":"kv.fetch","action_version":"1.0","payload":` + payload + `}]}`
}

// withAction wraps one action into an otherwise valid envelope.
func withAction(action string) string {
	return `{"protocol_version":"0.1","message_id":"m","actions":[` + action + `]}`
}

func TestParseMalformed(t *testing.T) {
	const ep = `"source_control_endpoint":"tcp://10.0.0.7:23280"`
	cases := []struct {
		name, in, want string
	}{
		// envelope
		{"invalid json", `{"protocol_version":`, "envelope: invalid JSON: unexpected EOF"},
		{"trailing data", `{"protocol_version":"0.1","message_id":"m","actions":[]} {}`, "envelope: unexpected data after the JSON value"},
		{"not an object: list", `[]`, "envelope: must be an object, got list"},
		{"not an object: string", `"hint"`, "envelope: must be an object, got string"},
		{"not an object: null", `null`, "envelope: must be an object, got null"},
		{"protocol_version missing", `{"message_id":"m","actions":[]}`, "protocol_version: missing"},
		{"protocol_version not string", `{"protocol_version":0.1,"message_id":"m","actions":[]}`, "protocol_version: must be a string, got number"},
		{"message_id missing", `{"protocol_version":"0.1","actions":[]}`, "message_id: missing"},
		{"message_id not string", `{"protocol_version":"0.1","message_id":7,"actions":[]}`, "message_id: must be a string, got number"},
		{"actions missing", `{"protocol_version":"0.1","message_id":"m"}`, "actions: missing"},
		{"actions not list", `{"protocol_version":"0.1","message_id":"m","actions":{}}`, "actions: must be a list, got object"},
		{"actions null", `{"protocol_version":"0.1","message_id":"m","actions":null}`, "actions: must be a list, got null"},
		// action shape
		{"action not object", withAction(`"kv.fetch"`), "actions[0]: must be an object, got string"},
		{"action_id missing", withAction(`{"action_type":"x","action_version":"1","payload":{}}`), "actions[0].action_id: missing"},
		{"action_id bool", withAction(`{"action_id":true,"action_type":"x","action_version":"1","payload":{}}`), "actions[0].action_id: must be a string, got bool"},
		{"action_id null", withAction(`{"action_id":null,"action_type":"x","action_version":"1","payload":{}}`), "actions[0].action_id: must be a string, got null"},
		{"action_id object", withAction(`{"action_id":{},"action_type":"x","action_version":"1","payload":{}}`), "actions[0].action_id: must be a string, got object"},
		{"action_id float overflow", withAction(`{"action_id":1e400,"action_type":"x","action_version":"1","payload":{}}`), "actions[0].action_id: number beyond a 64-bit float, got 1e400"},
		{"action_type missing", withAction(`{"action_id":"a","action_version":"1","payload":{}}`), "actions[0].action_type: missing"},
		{"action_type not string", withAction(`{"action_id":"a","action_type":["kv.fetch"],"action_version":"1","payload":{}}`), "actions[0].action_type: must be a string, got list"},
		{"action_type empty", withAction(`{"action_id":"a","action_type":"","action_version":"1","payload":{}}`), "actions[0].action_type: must not be empty"},
		{"action_version missing", withAction(`{"action_id":"a","action_type":"x","payload":{}}`), "actions[0].action_version: missing"},
		{"action_version not string", withAction(`{"action_id":"a","action_type":"x","action_version":[1],"payload":{}}`), "actions[0].action_version: must be a string, got list"},
		{"payload missing", withAction(`{"action_id":"a","action_type":"x","action_version":"1"}`), "actions[0].payload: missing"},
		{"unknown action payload not object", withAction(`{"action_id":"a","action_type":"x","action_version":"1","payload":[]}`), "actions[0].payload: must be an object, got list"},
		{"second action bad", withAction(`{"action_id":"a","action_type":"x","action_version":"1","payload":{}},{"action_id":"b"}`), "actions[1].action_type: missing"},
		// kv.fetch payload
		{"fetch payload not object", withPayload(`"tcp://h:1"`), "actions[0].payload: must be an object, got string"},
		{"fetch payload null", withPayload(`null`), "actions[0].payload: must be an object, got null"},
		{"endpoint not string", withPayload(`{"source_control_endpoint":5,"block_hashes":[1]}`), "actions[0].payload.source_control_endpoint: must be a non-empty tcp://host:port string, got number"},
		{"endpoint empty", withPayload(`{"source_control_endpoint":"","block_hashes":[1]}`), "actions[0].payload.source_control_endpoint: endpoint is empty, want tcp://host:port"},
		{"endpoint wrong scheme", withPayload(`{"source_control_endpoint":"http://h:1","block_hashes":[1]}`), `actions[0].payload.source_control_endpoint: endpoint "http://h:1": scheme "http" unsupported, want tcp://host:port`},
		{"endpoint no scheme", withPayload(`{"source_control_endpoint":"h:1","block_hashes":[1]}`), `actions[0].payload.source_control_endpoint: endpoint "h:1": missing tcp:// scheme`},
		{"endpoint path", withPayload(`{"source_control_endpoint":"tcp://h:1/x","block_hashes":[1]}`), `actions[0].payload.source_control_endpoint: endpoint "tcp://h:1/x": want tcp://host:port with no path, query, user or spaces`},
		{"endpoint missing port", withPayload(`{"source_control_endpoint":"tcp://h","block_hashes":[1]}`), `actions[0].payload.source_control_endpoint: endpoint "tcp://h": missing port`},
		{"endpoint empty port", withPayload(`{"source_control_endpoint":"tcp://h:","block_hashes":[1]}`), `actions[0].payload.source_control_endpoint: endpoint "tcp://h:": missing port`},
		{"endpoint port 0", withPayload(`{"source_control_endpoint":"tcp://h:0","block_hashes":[1]}`), `actions[0].payload.source_control_endpoint: endpoint "tcp://h:0": port "0" must be a number in 1..65535`},
		{"endpoint port 65536", withPayload(`{"source_control_endpoint":"tcp://h:65536","block_hashes":[1]}`), `actions[0].payload.source_control_endpoint: endpoint "tcp://h:65536": port "65536" must be a number in 1..65535`},
		{"endpoint port sign", withPayload(`{"source_control_endpoint":"tcp://h:+80","block_hashes":[1]}`), `actions[0].payload.source_control_endpoint: endpoint "tcp://h:+80": port "+80" must be a number in 1..65535`},
		{"endpoint missing host", withPayload(`{"source_control_endpoint":"tcp://:80","block_hashes":[1]}`), `actions[0].payload.source_control_endpoint: endpoint "tcp://:80": host is empty (0.0.0.0 and :: are bind-only; name the host peers dial)`},
		{"endpoint ipv6 unbracketed", withPayload(`{"source_control_endpoint":"tcp://fd00::1:80","block_hashes":[1]}`), `actions[0].payload.source_control_endpoint: endpoint "tcp://fd00::1:80": IPv6 host must be bracketed, as in tcp://[::1]:9000`},
		{"endpoint ipv6 unterminated", withPayload(`{"source_control_endpoint":"tcp://[fd00::1:80","block_hashes":[1]}`), `actions[0].payload.source_control_endpoint: endpoint "tcp://[fd00::1:80": unterminated IPv6 bracket`},
		{"endpoint ipv6 no port", withPayload(`{"source_control_endpoint":"tcp://[fd00::1]","block_hashes":[1]}`), `actions[0].payload.source_control_endpoint: endpoint "tcp://[fd00::1]": missing port`},
		{"endpoint bracketed v4", withPayload(`{"source_control_endpoint":"tcp://[10.0.0.1]:80","block_hashes":[1]}`), `actions[0].payload.source_control_endpoint: endpoint "tcp://[10.0.0.1]:80": host "10.0.0.1" is not an IPv6 address`},
		{"endpoint ipv6 zone", withPayload(`{"source_control_endpoint":"tcp://[fe80::1%eth0]:80","block_hashes":[1]}`), `actions[0].payload.source_control_endpoint: endpoint "tcp://[fe80::1%eth0]:80": host "fe80::1%eth0": IPv6 zones are not allowed`},
		{"endpoint wildcard v4", withPayload(`{"source_control_endpoint":"tcp://0.0.0.0:80","block_hashes":[1]}`), `actions[0].payload.source_control_endpoint: endpoint "tcp://0.0.0.0:80": host "0.0.0.0": wildcard address is bind-only and cannot be advertised`},
		{"endpoint wildcard v6", withPayload(`{"source_control_endpoint":"tcp://[::]:80","block_hashes":[1]}`), `actions[0].payload.source_control_endpoint: endpoint "tcp://[::]:80": host "::": wildcard address is bind-only and cannot be advertised`},
		{"endpoint wildcard v6 mapped", withPayload(`{"source_control_endpoint":"tcp://[::ffff:0.0.0.0]:80","block_hashes":[1]}`), `actions[0].payload.source_control_endpoint: endpoint "tcp://[::ffff:0.0.0.0]:80": host "::ffff:0.0.0.0": wildcard address is bind-only and cannot be advertised`},
		{"endpoint bad v4", withPayload(`{"source_control_endpoint":"tcp://10.0.0.256:80","block_hashes":[1]}`), `actions[0].payload.source_control_endpoint: endpoint "tcp://10.0.0.256:80": host "10.0.0.256" is not an IPv4 address`},
		{"endpoint bad hostname", withPayload(`{"source_control_endpoint":"tcp://-bad-:80","block_hashes":[1]}`), `actions[0].payload.source_control_endpoint: endpoint "tcp://-bad-:80": hostname "-bad-": a label starts or ends with '-'`},
		{"block_hashes missing", withPayload(`{` + ep + `}`), "actions[0].payload.block_hashes: missing"},
		{"block_hashes not list", withPayload(`{` + ep + `,"block_hashes":"1,2"}`), "actions[0].payload.block_hashes: must be a list of integers, got string"},
		{"block_hashes null", withPayload(`{` + ep + `,"block_hashes":null}`), "actions[0].payload.block_hashes: must be a list of integers, got null"},
		{"block_hashes empty", withPayload(`{` + ep + `,"block_hashes":[]}`), "actions[0].payload.block_hashes: must not be empty"},
		{"hash negative", withPayload(`{` + ep + `,"block_hashes":[1,2,3,-1]}`), "actions[0].payload.block_hashes[3]: must be an integer in [0, 2^64), got -1"},
		{"hash bool", withPayload(`{` + ep + `,"block_hashes":[true]}`), "actions[0].payload.block_hashes[0]: must be an integer in [0, 2^64), got true"},
		{"hash float", withPayload(`{` + ep + `,"block_hashes":[1.5]}`), "actions[0].payload.block_hashes[0]: must be an integer in [0, 2^64), got 1.5"},
		{"hash 1.0", withPayload(`{` + ep + `,"block_hashes":[1.0]}`), "actions[0].payload.block_hashes[0]: must be an integer in [0, 2^64), got 1.0"},
		{"hash 1e3", withPayload(`{` + ep + `,"block_hashes":[7,1e3]}`), "actions[0].payload.block_hashes[1]: must be an integer in [0, 2^64), got 1e3"},
		{"hash string", withPayload(`{` + ep + `,"block_hashes":["12"]}`), `actions[0].payload.block_hashes[0]: must be an integer in [0, 2^64), got "12"`},
		{"hash null", withPayload(`{` + ep + `,"block_hashes":[null]}`), "actions[0].payload.block_hashes[0]: must be an integer in [0, 2^64), got null"},
		{"hash list", withPayload(`{` + ep + `,"block_hashes":[[1]]}`), "actions[0].payload.block_hashes[0]: must be an integer in [0, 2^64), got [1]"},
		{"hash 2^64", withPayload(`{` + ep + `,"block_hashes":[18446744073709551616]}`), "actions[0].payload.block_hashes[0]: must be an integer in [0, 2^64), got 18446744073709551616"},
		{"hash huge", withPayload(`{` + ep + `,"block_hashes":[1000000000000000000000000000000000000000000000000]}`), "actions[0].payload.block_hashes[0]: must be an integer in [0, 2^64), got 1000000000000000000000000000000000000000…"},
		{"mode move", withPayload(`{` + ep + `,"block_hashes":[1],"mode":"move"}`), `actions[0].payload.mode: "move" is not supported (only "copy")`},
		{"mode unknown", withPayload(`{` + ep + `,"block_hashes":[1],"mode":"fast"}`), `actions[0].payload.mode: must be "copy" or "move", got "fast"`},
		{"mode not string", withPayload(`{` + ep + `,"block_hashes":[1],"mode":1}`), `actions[0].payload.mode: must be "copy" or "move", got 1`},
		{"mode null", withPayload(`{` + ep + `,"block_hashes":[1],"mode":null}`), `actions[0].payload.mode: must be "copy" or "move", got null`},
		{"no_retain string", withPayload(`{` + ep + `,"block_hashes":[1],"no_retain":"yes"}`), `actions[0].payload.no_retain: must be a bool, got "yes"`},
		{"no_retain number", withPayload(`{` + ep + `,"block_hashes":[1],"no_retain":0}`), `actions[0].payload.no_retain: must be a bool, got 0`},
		{"no_retain null", withPayload(`{` + ep + `,"block_hashes":[1],"no_retain":null}`), `actions[0].payload.no_retain: must be a bool, got null`},
		// the legacy name is validated exactly like kv.fetch
		{"legacy bad hash", withAction(`{"action_id":"a1","action_type":"kv.source_locations","action_version":"1.0","payload":{"block_hashes":[-5]}}`), "actions[0].payload.block_hashes[0]: must be an integer in [0, 2^64), got -5"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := NewParser(nil)
			env, err := p.Parse([]byte(c.in))
			if err == nil {
				t.Fatalf("Parse accepted %s: %s", c.in, env.Marshal())
			}
			if env != nil {
				t.Errorf("Parse returned an envelope with an error")
			}
			if err.Error() != c.want {
				t.Errorf("error\n got: %s\nwant: %s", err, c.want)
			}
			if !errors.Is(err, ErrMalformed) || errors.Is(err, ErrIgnored) {
				t.Errorf("error %v: want ErrMalformed only", err)
			}
			var pe *Error
			if !errors.As(err, &pe) || !strings.HasPrefix(c.want, pe.Path+": ") {
				t.Errorf("error path %q does not lead the message", pe.Path)
			}
			if got := p.Counters().Malformed; got != 1 {
				t.Errorf("Malformed counter advanced by %d, want 1", got)
			}
		})
	}
}

func TestParseValid(t *testing.T) {
	yes := true
	cases := []struct {
		name, in string
		want     Fetch
		out      string // normalised Marshal output
	}{
		{
			"router form",
			`{"protocol_version":"0.1","message_id":"msg-123","actions":[{"action_id":"a1","action_type":"kv.fetch","action_version":"1.0","payload":{"source_control_endpoint":"tcp://127.0.0.1:23280","block_hashes":[11,22]}}]}`,
			Fetch{SourceEndpoint: "tcp://127.0.0.1:23280", BlockHashes: []uint64{11, 22}, Mode: "copy"},
			`{"protocol_version":"0.1","message_id":"msg-123","actions":[{"action_id":"a1","action_type":"kv.fetch","action_version":"1.0","payload":{"source_control_endpoint":"tcp://127.0.0.1:23280","block_hashes":[11,22]}}]}`,
		},
		{
			"normalises endpoint, drops default mode and unknown payload keys, keeps no_retain",
			` { "protocol_version" : "0.1", "message_id": "", "extra": 1, "actions": [ {"payload": {"framework_hint": {"x": 1}, "mode": "copy", "no_retain": true, "block_hashes": [ 0, 18446744073709551615 ], "source_control_endpoint": "tcp://[FD00:0::1]:080"}, "action_version": "1.0", "action_type": "kv.fetch", "action_id": "a-9"} ] } `,
			Fetch{SourceEndpoint: "tcp://[fd00::1]:80", BlockHashes: []uint64{0, math.MaxUint64}, Mode: "copy", NoRetain: &yes},
			`{"protocol_version":"0.1","message_id":"","actions":[{"action_id":"a-9","action_type":"kv.fetch","action_version":"1.0","payload":{"source_control_endpoint":"tcp://[fd00::1]:80","block_hashes":[0,18446744073709551615],"no_retain":true}}]}`,
		},
		{
			"no source endpoint (null) means local storage",
			withPayload(`{"source_control_endpoint":null,"block_hashes":[5]}`),
			Fetch{BlockHashes: []uint64{5}, Mode: "copy"},
			`{"protocol_version":"0.1","message_id":"m","actions":[{"action_id":"a1","action_type":"kv.fetch","action_version":"1.0","payload":{"block_hashes":[5]}}]}`,
		},
		{
			"legacy kv.source_locations converted, hostname kept",
			withAction(`{"action_id":"a-1","action_type":"kv.source_locations","action_version":"1.0","payload":{"source_control_endpoint":"tcp://worker-3.pod-a.local:5557","block_hashes":[9]}}`),
			Fetch{SourceEndpoint: "tcp://worker-3.pod-a.local:5557", BlockHashes: []uint64{9}, Mode: "copy"},
			`{"protocol_version":"0.1","message_id":"m","actions":[{"action_id":"a-1","action_type":"kv.fetch","action_version":"1.0","payload":{"source_control_endpoint":"tcp://worker-3.pod-a.local:5557","block_hashes":[9]}}]}`,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env, err := Parse([]byte(c.in))
			if err != nil {
				t.Fatal(err)
			}
			f, ok := env.Fetch()
			if !ok {
				t.Fatal("no fetch action")
			}
			if !reflect.DeepEqual(*f, c.want) {
				t.Errorf("fetch\n got: %+v\nwant: %+v", *f, c.want)
			}
			if got := string(env.Marshal()); got != c.out {
				t.Errorf("marshal\n got: %s\nwant: %s", got, c.out)
			}
		})
	}
}

func TestLegacyCounted(t *testing.T) {
	p := NewParser(nil)
	_, err := p.Parse([]byte(withAction(`{"action_id":"a","action_type":"kv.source_locations","action_version":"1.0","payload":{"block_hashes":[1]}}`)))
	if err != nil {
		t.Fatal(err)
	}
	if d := p.Counters().LegacyConverted; d != 1 {
		t.Errorf("LegacyConverted advanced by %d", d)
	}
}

func TestLargeHashesExact(t *testing.T) {
	// Values float64 cannot represent: 2^64-1, 2^63+1, 2^53+1.
	hashes := []uint64{math.MaxUint64, 1<<63 + 1, 1<<53 + 1, 0}
	env := NewFetch("sel-1", "tcp://10.0.0.7:23280", hashes)
	out := env.Marshal()
	want := `{"protocol_version":"0.1","message_id":"sel-1","actions":[{"action_id":"a1","action_type":"kv.fetch","action_version":"1.0","payload":{"source_control_endpoint":"tcp://10.0.0.7:23280","block_hashes":[18446744073709551615,9223372036854775809,9007199254740993,0]}}]}`
	if string(out) != want {
		t.Fatalf("got  %s\nwant %s", out, want)
	}
	back, err := Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := back.Fetch()
	if !reflect.DeepEqual(f.BlockHashes, hashes) {
		t.Errorf("hashes %v, want %v", f.BlockHashes, hashes)
	}
	// NewFetch copies its input.
	hashes[0] = 1
	if g, _ := env.Fetch(); g.BlockHashes[0] != math.MaxUint64 {
		t.Error("NewFetch aliases the caller's slice")
	}
}

func TestFetchReturnsCopy(t *testing.T) {
	env, err := Parse([]byte(withPayload(`{"block_hashes":[1,2],"no_retain":false}`)))
	if err != nil {
		t.Fatal(err)
	}
	f, _ := env.Fetch()
	f.BlockHashes[0] = 99
	*f.NoRetain = true
	g, _ := env.Fetch()
	if g.BlockHashes[0] != 1 || *g.NoRetain {
		t.Error("Fetch exposes internal state")
	}
}

func TestUnknownActionsRoundTripByteForByte(t *testing.T) {
	// Odd spacing, key order, nested values, large numbers, escapes and a
	// field outside the four known ones must all survive untouched.
	unknown1 := `{ "payload" : {"b":[1, 2.50, 1e400, 18446744073709551616], "a":{"z":null}} ,"action_version":"7.3","action_type":"kv.future_action","action_id":"x", "extra":"\u00e9\n"}`
	unknown2 := `{"action_id":"p","action_type":"vllm.set_priority","action_version":"1.0","payload":{"target":"request_cached","location":"local_g1","claim_id":"c","revision":3,"value":null,"ttl_seconds":30}}`
	fetch := `{"action_id":"a1","action_type":"kv.fetch","action_version":"1.0","payload":{"block_hashes":[3]}}`
	in := `{"protocol_version":"0.1","message_id":"m","actions":[` + unknown1 + `,` + fetch + `,` + unknown2 + `]}`
	env, err := Parse([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	out := env.Marshal()
	want := `{"protocol_version":"0.1","message_id":"m","actions":[` + unknown1 + `,` + fetch + `,` + unknown2 + `]}`
	if string(out) != want {
		t.Fatalf("got  %s\nwant %s", out, want)
	}
	if env.Actions[0].Type != "kv.future_action" || env.Actions[0].Version != "7.3" || env.Actions[0].ID != "x" {
		t.Errorf("unknown action fields: %+v", env.Actions[0])
	}
	if !bytes.Contains(env.Actions[0].Payload, []byte(`1e400`)) {
		t.Errorf("payload %s", env.Actions[0].Payload)
	}
	// An unknown action next to kv.fetch does not suppress it.
	if f, ok := env.Fetch(); !ok || f.BlockHashes[0] != 3 {
		t.Error("fetch lost next to unknown actions")
	}
}

// newLoggingParser is a Parser whose warnings land in the returned buffer.
func newLoggingParser() (*Parser, *bytes.Buffer) {
	var logs bytes.Buffer
	return NewParser(slog.New(slog.NewTextHandler(&logs, nil))), &logs
}

func TestVersionPolicy(t *testing.T) {
	p, logs := newLoggingParser()

	t.Run("unknown protocol ignored and warned once", func(t *testing.T) {
		before := p.Counters()
		in := []byte(`{"protocol_version":"9.9-test","message_id":"m","actions":"anything goes in a future protocol"}`)
		for range 3 {
			env, err := p.Parse(in)
			if env != nil || !errors.Is(err, ErrIgnored) || errors.Is(err, ErrMalformed) {
				t.Fatalf("got %v, %v; want ErrIgnored", env, err)
			}
			if want := `protocol_version: unsupported "9.9-test" (supported "0.1"); hint ignored`; err.Error() != want {
				t.Errorf("error %q, want %q", err, want)
			}
		}
		after := p.Counters()
		if after.IgnoredVersion-before.IgnoredVersion != 3 || after.Malformed != before.Malformed {
			t.Errorf("counters before %+v after %+v", before, after)
		}
		if n := strings.Count(logs.String(), "received=9.9-test"); n != 1 {
			t.Errorf("warned %d times, want 1:\n%s", n, logs.String())
		}
	})

	t.Run("fetch with unknown action_version skipped but carried", func(t *testing.T) {
		before := p.Counters().SkippedActions
		future := `{"action_id":"a2","action_type":"kv.fetch","action_version":"2.0","payload":{"block_hashes":"a new schema"}}`
		in := withAction(future + `,{"action_id":"a1","action_type":"kv.fetch","action_version":"1.0","payload":{"block_hashes":[4]}}`)
		env, err := p.Parse([]byte(in))
		if err != nil {
			t.Fatal(err)
		}
		if d := p.Counters().SkippedActions - before; d != 1 {
			t.Errorf("SkippedActions advanced by %d", d)
		}
		f, ok := env.Fetch()
		if !ok || !reflect.DeepEqual(f.BlockHashes, []uint64{4}) {
			t.Errorf("Fetch picked %+v, want the 1.0 action", f)
		}
		if !bytes.Contains(env.Marshal(), []byte(future)) {
			t.Errorf("unknown-version kv.fetch not carried opaquely: %s", env.Marshal())
		}
	})

	t.Run("legacy with unknown action_version dropped", func(t *testing.T) {
		before := p.Counters().SkippedActions
		env, err := p.Parse([]byte(withAction(`{"action_id":"a1","action_type":"kv.source_locations","action_version":"0.9","payload":{}}`)))
		if err != nil {
			t.Fatal(err)
		}
		if len(env.Actions) != 0 || p.Counters().SkippedActions-before != 1 {
			t.Errorf("actions %d; legacy name must never be emitted", len(env.Actions))
		}
		if bytes.Contains(env.Marshal(), []byte("source_locations")) {
			t.Error("legacy name emitted")
		}
	})
}

func TestFirstFetchWins(t *testing.T) {
	env, err := Parse([]byte(withAction(
		`{"action_id":"a1","action_type":"kv.fetch","action_version":"1.0","payload":{"block_hashes":[1]}},` +
			`{"action_id":"a2","action_type":"kv.fetch","action_version":"1.0","payload":{"block_hashes":[2]}}`)))
	if err != nil {
		t.Fatal(err)
	}
	if f, _ := env.Fetch(); f.BlockHashes[0] != 1 {
		t.Errorf("got %v", f.BlockHashes)
	}
	if _, ok := (&Envelope{}).Fetch(); ok {
		t.Error("empty envelope has a fetch")
	}
	var nilEnv *Envelope
	if _, ok := nilEnv.Fetch(); ok {
		t.Error("nil envelope has a fetch")
	}
}

func TestKeysAreCaseSensitive(t *testing.T) {
	// Struct decoding would fold case; the envelope must not.
	_, err := Parse([]byte(`{"Protocol_Version":"0.1","message_id":"m","actions":[]}`))
	if err == nil || err.Error() != "protocol_version: missing" {
		t.Errorf("got %v", err)
	}
}

func TestMarshalJSONEmbeds(t *testing.T) {
	env := NewFetch("s", "tcp://h:1", []uint64{math.MaxUint64})
	b, err := json.Marshal(map[string]any{"kv_hint": env})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"kv_hint":` + string(env.Marshal()) + `}`
	if string(b) != want {
		t.Errorf("got %s want %s", b, want)
	}
}

func TestHandBuiltAction(t *testing.T) {
	env := &Envelope{ProtocolVersion: "0.1", MessageID: "m", Actions: []Action{
		{ID: "p", Type: "vllm.set_priority", Version: "1.0", Payload: json.RawMessage(`{"value":1}`)},
		{ID: "q", Type: "x.empty", Version: "1"},
	}}
	want := `{"protocol_version":"0.1","message_id":"m","actions":[{"action_id":"p","action_type":"vllm.set_priority","action_version":"1.0","payload":{"value":1}},{"action_id":"q","action_type":"x.empty","action_version":"1","payload":{}}]}`
	if got := string(env.Marshal()); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if _, err := Parse(env.Marshal()); err != nil {
		t.Error(err)
	}
}

func TestCountersOnlyForAcceptedEnvelopes(t *testing.T) {
	p := NewParser(nil)
	before := p.Counters()
	// A skippable action and a legacy one, then a malformed action: the
	// envelope is rejected, so only Malformed moves.
	in := withAction(`{"action_id":"a","action_type":"kv.fetch","action_version":"3.0","payload":{}},` +
		`{"action_id":"b","action_type":"kv.source_locations","action_version":"1.0","payload":{"block_hashes":[1]}},` +
		`{"action_id":"c"}`)
	if _, err := p.Parse([]byte(in)); err == nil {
		t.Fatal("accepted")
	}
	after := p.Counters()
	want := before
	want.Malformed++
	if after != want {
		t.Errorf("counters %+v, want %+v", after, want)
	}
}

func TestParseDoesNotAliasInput(t *testing.T) {
	in := []byte(withAction(`{"action_id":"x","action_type":"y.z","action_version":"1","payload":{"k":"AAAA"}}`))
	env, err := Parse(in)
	if err != nil {
		t.Fatal(err)
	}
	want := string(env.Marshal())
	for i := range in {
		in[i] = ' '
	}
	if got := string(env.Marshal()); got != want {
		t.Errorf("envelope changed with the caller's buffer: %s", got)
	}
}

func TestParseConcurrent(t *testing.T) {
	// One Parser serves many requests at once; run under -race.
	defer goleak.VerifyNone(t)
	inputs := [][]byte{
		[]byte(withPayload(`{"block_hashes":[1]}`)),
		[]byte(`{"protocol_version":"0.7-concurrent","message_id":"","actions":[]}`),
		[]byte(withAction(`{"action_id":"a","action_type":"kv.fetch","action_version":"1.1","payload":{}}`)),
		[]byte(`[]`),
	}
	p := NewParser(nil)
	before := p.Counters()
	done := make(chan struct{})
	const workers, rounds = 4, 50
	for w := range workers {
		go func() {
			defer func() { done <- struct{}{} }()
			for r := range rounds {
				_, _ = p.Parse(inputs[(w+r)%len(inputs)])
				_ = p.Counters()
			}
		}()
	}
	for range workers {
		<-done
	}
	after := p.Counters()
	per := uint64(workers * rounds / len(inputs))
	if after.IgnoredVersion-before.IgnoredVersion != per || after.SkippedActions-before.SkippedActions != per ||
		after.Malformed-before.Malformed != per {
		t.Errorf("counters before %+v after %+v, want +%d each", before, after, per)
	}
}

// Parse (kvmesh hints validate) gives a Parser's result with no log line
// and no count: its caller shows the error, which is the one message.
func TestParseQuiet(t *testing.T) {
	p, logs := newLoggingParser()
	env, err := Parse([]byte(`{"protocol_version":"9.8-validate","message_id":"m","actions":[]}`))
	if env != nil || !errors.Is(err, ErrIgnored) || err.Error() != `protocol_version: unsupported "9.8-validate" (supported "0.1"); hint ignored` {
		t.Fatalf("got %v, %v; want the ErrIgnored error", env, err)
	}
	future := `{"action_id":"a2","action_type":"kv.fetch","action_version":"2.7-validate","payload":{}}`
	in := []byte(withAction(future + `,{"action_id":"a1","action_type":"kv.fetch","action_version":"1.0","payload":{"block_hashes":[4]}}`))
	env, err = Parse(in)
	if err != nil {
		t.Fatal(err)
	}
	served, err := p.Parse(in)
	if err != nil || !reflect.DeepEqual(env, served) {
		t.Fatalf("Parse's envelope %+v differs from the Parser's %+v (%v)", env, served, err)
	}
	if _, err := Parse([]byte(`{"protocol_version":"0.1"}`)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("malformed: %v", err)
	}
	// The Parser, the serving path, warns once and counts.
	if n := strings.Count(logs.String(), "received=2.7-validate"); n != 1 {
		t.Fatalf("the Parser warned %d times, want 1:\n%s", n, logs.String())
	}
	if c := p.Counters(); c.SkippedActions != 1 || c.IgnoredVersion != 0 || c.Malformed != 0 {
		t.Fatalf("counters %+v", c)
	}
}

// Two Parsers share nothing: each warns and counts on its own.
func TestParsersIndependent(t *testing.T) {
	a, alogs := newLoggingParser()
	b, blogs := newLoggingParser()
	in := []byte(`{"protocol_version":"9.7-pair","message_id":"m","actions":[]}`)
	_, _ = a.Parse(in)
	_, _ = a.Parse(in)
	_, _ = b.Parse(in)
	if a.Counters().IgnoredVersion != 2 || b.Counters().IgnoredVersion != 1 {
		t.Fatalf("counters %+v / %+v", a.Counters(), b.Counters())
	}
	if strings.Count(alogs.String(), "received=9.7-pair") != 1 || strings.Count(blogs.String(), "received=9.7-pair") != 1 {
		t.Fatalf("warnings:\n%s\n%s", alogs, blogs)
	}
}
