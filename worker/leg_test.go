package worker

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/api"
)

func TestAdmitLeg(t *testing.T) {
	params := []byte(`{"kvmesh_sim_handoff":1,"request_id":"r","block_hashes":[18446744073709551615]}`)
	withHint := []byte(`{"kvmesh_sim_handoff":1,"request_id":"r","block_hashes":[18446744073709551615],"kv_hint":{"x":1},"router_hint":{}}`)
	for _, tc := range []struct {
		name       string
		leg        api.Leg
		params     []byte
		wantErr    bool
		wantParams string // "" none; "same" the input bytes
		dropHint   bool
		dropped    bool
		stripped   bool
	}{
		{"whole, no params", api.Leg_LEG_WHOLE, nil, false, "", false, false, false},
		{"prefill, no params", api.Leg_LEG_PREFILL, nil, false, "", false, false, false},
		{"whole with foreign params: dropped", api.Leg_LEG_WHOLE, []byte(`{"remote_host":"evil"}`), false, "", false, true, false},
		{"whole posing as handoff: no hint", api.Leg_LEG_WHOLE, []byte(`{"do_remote_prefill":true}`), false, "", true, true, false},
		{"prefill with params: dropped", api.Leg_LEG_PREFILL, params, false, "", false, true, false},
		{"decode: params whole, no hint", api.Leg_LEG_DECODE, params, false, "same", true, false, false},
		{"decode: hint keys stripped", api.Leg_LEG_DECODE, withHint, false, string(params), true, false, true},
		{"decode without params", api.Leg_LEG_DECODE, nil, true, "", true, false, false},
		{"decode with non-object params", api.Leg_LEG_DECODE, []byte(`[1]`), true, "", true, false, false},
		{"decode with null params", api.Leg_LEG_DECODE, []byte(`null`), true, "", true, false, false},
		{"unknown leg", api.Leg(9), nil, true, "", false, false, false},
	} {
		a, err := admitLeg(&api.GenerateRequest{Leg: tc.leg, KvTransferParams: tc.params})
		if (err != nil) != tc.wantErr {
			t.Errorf("%s: err %v", tc.name, err)
			continue
		}
		if err != nil {
			continue
		}
		switch tc.wantParams {
		case "":
			if a.params != nil {
				t.Errorf("%s: params %s passed on", tc.name, a.params)
			}
		case "same":
			if &a.params[0] != &tc.params[0] || len(a.params) != len(tc.params) {
				t.Errorf("%s: params copied, want the same bytes", tc.name)
			}
		default:
			var got, want any
			_ = json.Unmarshal(a.params, &got)
			_ = json.Unmarshal([]byte(tc.wantParams), &want)
			gb, _ := json.Marshal(got)
			wb, _ := json.Marshal(want)
			if string(gb) != string(wb) || string(a.params) == string(tc.params) {
				t.Errorf("%s: params %s, want %s", tc.name, a.params, tc.wantParams)
			}
		}
		if a.dropHint != tc.dropHint || a.paramsDrop != tc.dropped || a.paramsStrip != tc.stripped {
			t.Errorf("%s: %+v", tc.name, a)
		}
	}
	// Stripping keeps large hashes exact.
	a, _ := admitLeg(&api.GenerateRequest{Leg: api.Leg_LEG_DECODE, KvTransferParams: withHint})
	if want := `18446744073709551615`; !json.Valid(a.params) || !strings.Contains(string(a.params), want) {
		t.Fatalf("stripped params lost precision: %s", a.params)
	}
}
