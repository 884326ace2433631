package sglang

import (
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// HintForm is how a request's KV hint reaches SGLang.
type HintForm string

const (
	// HintNative sends the envelope in GenerateReqInput's kv_hints field
	// (SGLang's native hint surface, sgl-project/sglang#38891).
	HintNative HintForm = "native"
	// HintBridge sends the older kv_router_hint {source_control_endpoint,
	// block_hashes}, with the hashes as SGLang published them (signed).
	HintBridge HintForm = "bridge"
	// HintOff sends none; the worker then declares it takes no hints.
	HintOff HintForm = "off"
)

// ParseHintForm reads a --hint-form value.
func ParseHintForm(s string) (HintForm, error) {
	switch f := HintForm(s); f {
	case HintNative, HintBridge, HintOff:
		return f, nil
	}
	return "", fmt.Errorf("%q: want native, bridge or off", s)
}

// Defaults of SGLang's server arguments, assumed when /get_server_info
// does not say.
const (
	DefaultPageSize      = 1    // --page-size
	DefaultBootstrapPort = 8998 // --disaggregation-bootstrap-port
)

// Config configures the adapter to one SGLang server.
type Config struct {
	// URL is the server's base URL, http://host:port.
	URL string
	// Model is the served model name; "" takes the server's. A name the
	// server does not serve is an error at start.
	Model string
	// Role must match the server's --disaggregation-mode (null is
	// aggregated).
	Role kv.Role
	// DPSize is the data-parallel ranks behind the server (SGLang's
	// --dp-size); requests name theirs in routed_dp_rank. 1 (the default)
	// takes the server's own dp_size.
	DPSize int
	// BlockSize, when non-zero, pins the block size: the server's
	// --page-size must agree.
	BlockSize int
	HintForm  HintForm // default native
	// BootstrapHost is the host a decode server dials for this (prefill)
	// server's KV; "" takes the host of URL, as SGLang's router does.
	BootstrapHost string
	// Events is rank 0's KV-event PUB endpoint (the endpoint of SGLang's
	// --kv-events-config, as this host dials it); "" relays no events.
	// ReplayEvents is rank 0's replay endpoint; Topic the events' topic.
	Events, ReplayEvents, Topic string
	// StatsInterval is how often /metrics is read for load; default 500ms.
	StatsInterval time.Duration
	// HealthInterval is how often /health is polled after start (two
	// failed checks make the engine unhealthy until one passes); default
	// remote.DefaultHealthInterval.
	HealthInterval time.Duration
	// Client is the HTTP client; default one without a timeout (streams
	// last as long as generations).
	Client *http.Client
	Logger *slog.Logger
}
