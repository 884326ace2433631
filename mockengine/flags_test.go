package mockengine

import (
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/events"
)

func TestParseVLLMJSONFlags(t *testing.T) {
	ec, err := ParseKVEventsConfig(`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558","topic":"kv"}`)
	if err != nil || ec.Endpoint != "tcp://*:5557" || ec.ReplayEndpoint != "tcp://*:5558" || ec.Topic != "kv" ||
		ec.BindMode != events.BindAuto || ec.Shape != events.ShapeMap {
		t.Fatalf("%+v %v", ec, err)
	}
	if ec, err := ParseKVEventsConfig(`{"enable_kv_cache_events":false}`); ec != nil || err != nil {
		t.Fatalf("disabled: %+v %v", ec, err)
	}
	if ec, err := ParseKVEventsConfig(`{"enable_kv_cache_events":true}`); err != nil || ec.Endpoint != "tcp://*:5557" {
		t.Fatalf("default endpoint: %+v %v", ec, err)
	}
	if _, err := ParseKVEventsConfig(`{"enable_kv_cache_events":true,"publisher":"kafka"}`); err == nil {
		t.Fatal("kafka publisher accepted")
	}
	kt, err := ParseKVTransferConfig(`{"kv_connector":"NixlConnector","kv_role":"kv_producer","engine_id":"e1","kv_connector_extra_config":{"kv_lease_duration":12}}`)
	if err != nil || kt.Role != RoleProducer || kt.EngineID != "e1" || kt.LeaseDuration != 12*time.Second {
		t.Fatalf("%+v %v", kt, err)
	}
	for _, bad := range []string{`{"kv_connector":"LMCacheConnectorV1"}`, `{"kv_connector":"NixlConnector","kv_role":"x"}`, `{`} {
		if _, err := ParseKVTransferConfig(bad); err == nil || !strings.Contains(err.Error(), "--kv-transfer-config") {
			t.Errorf("%s: %v", bad, err)
		}
	}
}

// TestDataParallelRanks: a request pinned to rank 1 runs there, and its
// P/D handoff names rank 1's side channel.
func TestDataParallelRanks(t *testing.T) {
	sc := testSim()
	sc.DPSize = 2
	v, url := startVLLM(t, VLLMConfig{Sim: sc, KVTransfer: connector(RoleBoth, time.Minute)})
	c := decodePrefill(t, url, map[string]string{"X-data-parallel-rank": "1"})
	if c.RemotePort != v.SideChannelPort(1) || v.SideChannelPort(1) == v.SideChannelPort(0) || v.LeaseStats(1).Held != 1 || v.LeaseStats(0).Held != 0 {
		t.Fatalf("handoff %+v, ports %d %d", c, v.SideChannelPort(0), v.SideChannelPort(1))
	}
	if code, _ := post(t, url+"/v1/completions", map[string]any{"prompt": "x"}, map[string]string{"X-data-parallel-rank": "2"}); code != 400 {
		t.Fatalf("rank 2 of 2: status %d", code)
	}
}

func decodePrefill(t *testing.T, url string, hdr map[string]string) handoff {
	t.Helper()
	code, b := post(t, url+"/v1/completions", prefillLeg(seqTokens(40, 9)), hdr)
	if code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	return decode[handoff](t, decode[completion](t, b).KVTransferParams)
}
