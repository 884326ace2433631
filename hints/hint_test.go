package hints

import (
	"errors"
	"reflect"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

// A typed hint lowers to the envelope the wire shape documents; parsing it
// back gives the hint (less its source key, which the envelope does not
// carry).
func TestFromHint(t *testing.T) {
	h := &kv.Hint{ID: "sel-7", Source: kv.WorkerKey{Instance: 3}, Endpoint: "tcp://10.0.0.7:23280",
		Hashes: []kv.EngineHash{11, 22, 1<<64 - 1}}
	env := FromHint(h)
	want := `{"protocol_version":"0.1","message_id":"sel-7","actions":[{"action_id":"a1","action_type":"kv.fetch",` +
		`"action_version":"1.0","payload":{"source_control_endpoint":"tcp://10.0.0.7:23280","block_hashes":[11,22,18446744073709551615]}}]}`
	if got := string(env.Marshal()); got != want {
		t.Fatalf("envelope\n got %s\nwant %s", got, want)
	}
	parsed, err := Parse(env.Marshal())
	if err != nil {
		t.Fatal(err)
	}
	back, ok := parsed.Hint()
	if wantBack := (&kv.Hint{ID: h.ID, Endpoint: h.Endpoint, Hashes: h.Hashes}); !ok || !reflect.DeepEqual(back, wantBack) {
		t.Fatalf("back %+v ok=%v, want %+v", back, ok, wantBack)
	}
	// An envelope with no source endpoint is no hint kvmesh can act on.
	if _, ok := NewFetch("m", "", []uint64{1}).Hint(); ok {
		t.Fatal("hint without a source")
	}
}

func TestCheckHint(t *testing.T) {
	for _, tc := range []struct {
		name   string
		h      kv.Hint
		max    int
		path   string // "" = valid
		wantEp string
	}{
		{"valid", kv.Hint{Endpoint: "tcp://10.0.0.7:23280", Hashes: []kv.EngineHash{1, 2}}, 2, "", "tcp://10.0.0.7:23280"},
		{"canonical endpoint", kv.Hint{Endpoint: "tcp://[0:0::1]:080", Hashes: []kv.EngineHash{1}}, 4, "", "tcp://[::1]:80"},
		{"no endpoint", kv.Hint{Hashes: []kv.EngineHash{1}}, 4, "kv_fetch.source_control_endpoint", ""},
		{"wildcard endpoint", kv.Hint{Endpoint: "tcp://0.0.0.0:9", Hashes: []kv.EngineHash{1}}, 4, "kv_fetch.source_control_endpoint", ""},
		{"not tcp", kv.Hint{Endpoint: "http://h:9", Hashes: []kv.EngineHash{1}}, 4, "kv_fetch.source_control_endpoint", ""},
		{"no hashes", kv.Hint{Endpoint: "tcp://h:9"}, 4, "kv_fetch.block_hashes", ""},
		{"longer than the prompt", kv.Hint{Endpoint: "tcp://h:9", Hashes: []kv.EngineHash{1, 2, 3}}, 2, "kv_fetch.block_hashes", ""},
	} {
		h := tc.h
		err := CheckHint(&h, tc.max)
		if tc.path == "" {
			if err != nil || h.Endpoint != tc.wantEp {
				t.Errorf("%s: %v, endpoint %q want %q", tc.name, err, h.Endpoint, tc.wantEp)
			}
			continue
		}
		var e *Error
		if !errors.As(err, &e) || e.Path != tc.path || !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: error %v, want one at %s", tc.name, err, tc.path)
		}
	}
}
