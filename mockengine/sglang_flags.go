package mockengine

import (
	"fmt"

	"github.com/kvmesh/kvmesh/events"
)

// SGLangKVEventsConfig is SGLang's --kv-events-config JSON (KVEventsConfig
// in python/sglang/srt/disaggregation/kv_events.py).
type SGLangKVEventsConfig struct {
	ZMQEventsConfig
}

// ZMQEventsConfig is the ZMQ publisher's part of vLLM's and SGLang's
// --kv-events-config JSON, which they share.
type ZMQEventsConfig struct {
	Publisher      string  `json:"publisher"`
	Endpoint       string  `json:"endpoint"`
	ReplayEndpoint *string `json:"replay_endpoint"`
	BufferSteps    int     `json:"buffer_steps"`
	HWM            int     `json:"hwm"`
	MaxQueueSize   int     `json:"max_queue_size"`
	Topic          string  `json:"topic"`
}

// events is the publisher's configuration in shape; the endpoint defaults
// to tcp://*:5557, bound or connected by the engines' rule (bind for "*",
// "::", ipc, inproc).
func (c *ZMQEventsConfig) events(shape events.Shape) *EventsConfig {
	ec := &EventsConfig{Endpoint: c.Endpoint, BindMode: events.BindAuto, Topic: c.Topic,
		BufferSteps: c.BufferSteps, HWM: c.HWM, Shape: shape}
	if ec.Endpoint == "" {
		ec.Endpoint = "tcp://*:5557"
	}
	if c.ReplayEndpoint != nil {
		ec.ReplayEndpoint = *c.ReplayEndpoint
	}
	return ec
}

// ParseSGLangKVEventsConfig reads --kv-events-config as SGLang does: the
// publisher defaults to "null" (no events; set "zmq"), the endpoint to
// tcp://*:5557, bound or connected by SGLang's rule (bind for "*", "::",
// ipc, inproc). It returns nil when events stay off.
func ParseSGLangKVEventsConfig(data string) (*EventsConfig, error) {
	var c SGLangKVEventsConfig
	if err := decodeOne(data, &c); err != nil {
		return nil, fmt.Errorf("--kv-events-config: %w", err)
	}
	switch c.Publisher {
	case "", "null":
		return nil, nil
	case "zmq":
	default:
		return nil, fmt.Errorf("--kv-events-config: Unknown event publisher %q (want null or zmq)", c.Publisher)
	}
	return c.events(events.ShapeSGLang), nil
}
