package trtllm

import (
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// DefaultBlockSize is TensorRT-LLM's default tokens_per_block, assumed when
// the server's iteration stats do not report it and none is pinned.
const DefaultBlockSize = 32

// Config configures the adapter to one trtllm-serve.
type Config struct {
	// URL is the server's base URL, http://host:port.
	URL string
	// Model is the served model name; "" takes the one the server lists.
	Model string
	Role  kv.Role
	// BlockSize, when non-zero, pins the block size: the engine's own
	// (kvCacheStats.tokensPerBlock in /metrics) must agree.
	BlockSize int
	// Events is the base URL whose POST /kv_cache_events is polled for KV
	// events (normally URL itself); "" relays none.
	Events string
	// PollInterval is how often the events are polled; default 100ms.
	PollInterval time.Duration
	// StatsInterval is how often /metrics is read for load; default 500ms.
	StatsInterval time.Duration
	// HealthInterval is how often /health is polled after start (two
	// failed checks make the engine unhealthy until one passes); default
	// remote.DefaultHealthInterval.
	HealthInterval time.Duration
	// EventsHintAfter is how many finished generations without a single
	// KV event make the adapter say the engine's event buffer is off;
	// default 8.
	EventsHintAfter int
	// Client is the HTTP client; default one without a timeout.
	Client *http.Client
	Logger *slog.Logger
}

// HintForms says how KV hints reach TensorRT-LLM: they cannot.
const HintOff = "off"

// CheckHintForm refuses every hint form but off: trtllm-serve's request
// models forbid fields they do not define, and none carries a KV hint.
func CheckHintForm(s string) error {
	if s == "" || s == HintOff {
		return nil
	}
	return fmt.Errorf("%q: TensorRT-LLM's requests have no KV hint field (its OpenAI protocol refuses unknown fields), so the only form is off", s)
}
