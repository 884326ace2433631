package mockengine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/kvmesh/kvmesh/events"
)

// VLLMKVEventsConfig is vLLM's --kv-events-config JSON (KVEventsConfig).
type VLLMKVEventsConfig struct {
	EnableKVCacheEvents bool `json:"enable_kv_cache_events"`
	ZMQEventsConfig
}

// ParseKVEventsConfig reads --kv-events-config as vLLM does: events are
// on only with enable_kv_cache_events and the "zmq" publisher (vLLM's
// default once enabled); the endpoint defaults to tcp://*:5557 and binds
// or connects by vLLM's rule (bind for "*", "::", ipc, inproc). It returns
// nil when events stay off.
func ParseKVEventsConfig(data string) (*EventsConfig, error) {
	var c VLLMKVEventsConfig
	if err := decodeOne(data, &c); err != nil {
		return nil, fmt.Errorf("--kv-events-config: %w", err)
	}
	if !c.EnableKVCacheEvents {
		return nil, nil
	}
	switch c.Publisher {
	case "", "zmq":
	case "null":
		return nil, nil
	default:
		return nil, fmt.Errorf("--kv-events-config: publisher %q: the mock speaks zmq (or null)", c.Publisher)
	}
	return c.events(events.ShapeMap), nil
}

// VLLMKVTransferConfig is the part of vLLM's --kv-transfer-config JSON
// (KVTransferConfig) the mock reads.
type VLLMKVTransferConfig struct {
	KVConnector string         `json:"kv_connector"`
	KVRole      string         `json:"kv_role"`
	EngineID    string         `json:"engine_id"`
	ExtraConfig map[string]any `json:"kv_connector_extra_config"`
}

// ParseKVTransferConfig reads --kv-transfer-config: the NixlConnector (the
// only connector mimicked), kv_role, engine_id and
// kv_connector_extra_config.kv_lease_duration (seconds).
func ParseKVTransferConfig(data string) (*KVTransferConfig, error) {
	var c VLLMKVTransferConfig
	if err := decodeOne(data, &c); err != nil {
		return nil, fmt.Errorf("--kv-transfer-config: %w", err)
	}
	if c.KVConnector != "NixlConnector" {
		return nil, fmt.Errorf("--kv-transfer-config: kv_connector %q: the mock mimics NixlConnector only", c.KVConnector)
	}
	switch c.KVRole {
	case RoleProducer, RoleConsumer, RoleBoth:
	case "":
		c.KVRole = RoleBoth
	default:
		return nil, fmt.Errorf("--kv-transfer-config: kv_role %q: want %s, %s or %s", c.KVRole, RoleProducer, RoleConsumer, RoleBoth)
	}
	kt := &KVTransferConfig{Role: c.KVRole, EngineID: c.EngineID}
	if v, ok := c.ExtraConfig["kv_lease_duration"]; ok {
		secs, ok := v.(float64)
		if !ok || secs <= 0 {
			return nil, fmt.Errorf("--kv-transfer-config: kv_connector_extra_config.kv_lease_duration %v: want seconds > 0", v)
		}
		kt.LeaseDuration = time.Duration(secs * float64(time.Second))
	}
	return kt, nil
}

// decodeOne decodes exactly one JSON value; fields the mock does not use
// are ignored.
func decodeOne(data string, v any) error {
	dec := json.NewDecoder(bytes.NewReader([]byte(data)))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("unexpected data after the JSON object")
	}
	return nil
}
