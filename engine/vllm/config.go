package vllm

import (
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// HintForm is how a request's KV hint reaches vLLM.
type HintForm string

const (
	// HintNative sends the envelope in the request's top-level kv_hints
	// field (vLLM's native hint surface).
	HintNative HintForm = "native"
	// HintBridge sends it as kv_transfer_params.kv_hint, for vLLM builds
	// whose connector reads hints from its parameters.
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

// DefaultBlockSize is vLLM's default block size, assumed when the engine's
// /metrics does not report its cache config and none is pinned.
const DefaultBlockSize = 16

// Config configures the adapter to one vLLM server.
type Config struct {
	// URL is the server's base URL, http://host:port.
	URL string
	// Model is the served model name; "" takes the first the server lists.
	// A name the server does not list is an error at start.
	Model string
	Role  kv.Role
	// DPSize is the data-parallel ranks behind the server (vLLM's
	// --data-parallel-size); requests name their rank in the
	// X-data-parallel-rank header. Default 1.
	DPSize int
	// BlockSize, when non-zero, pins the block size: the engine's own
	// (from /metrics' vllm:cache_config_info) must agree.
	BlockSize int
	HintForm  HintForm // default native
	// Events is rank 0's KV-event PUB endpoint (vLLM's
	// --kv-events-config endpoint, as this host dials it); "" relays no
	// events. ReplayEvents is rank 0's replay endpoint; Topic the events'
	// topic.
	Events, ReplayEvents, Topic string
	// StatsInterval is how often /metrics is read for load; default 500ms.
	StatsInterval time.Duration
	// HealthInterval is how often /health is polled after start (two
	// failed checks in a row make the engine unhealthy, one good one
	// healthy again); default remote.DefaultHealthInterval.
	HealthInterval time.Duration
	// Client is the HTTP client; default one without a timeout (streams
	// last as long as generations).
	Client *http.Client
	Logger *slog.Logger
}
