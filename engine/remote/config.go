package remote

import (
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// Config is what every real-engine adapter is configured with; each
// adapter's own Config embeds it beside what only that engine has.
type Config struct {
	// URL is the server's base URL, http://host:port.
	URL string
	// Model is the served model name; "" takes the server's. A name the
	// server does not serve is an error at start.
	Model string
	// Role is the engine's part in disaggregated serving; default
	// aggregated.
	Role kv.Role
	// DPSize is the data-parallel ranks behind the server; default 1. An
	// adapter says how requests name their rank.
	DPSize int
	// BlockSize, when non-zero, pins the block size: the engine's own must
	// agree.
	BlockSize int
	// Events is where the engine's KV events come from ("" relays none):
	// rank 0's ZMQ PUB endpoint as this host dials it, or for an engine
	// whose events are polled, the base URL answering them. ReplayEvents
	// is rank 0's ZMQ replay endpoint; Topic the events' topic.
	Events, ReplayEvents, Topic string
	// StatsInterval is how often the engine's load is read; default
	// DefaultStatsInterval.
	StatsInterval time.Duration
	// HealthInterval is how often /health is polled after start (two
	// failed checks in a row make the engine unhealthy, one good one
	// healthy again); default DefaultHealthInterval.
	HealthInterval time.Duration
	// Client is the HTTP client; default one without a timeout (streams
	// last as long as generations).
	Client *http.Client
	Logger *slog.Logger
}

// DefaultStatsInterval is Config.StatsInterval's default.
const DefaultStatsInterval = 500 * time.Millisecond

// WithDefaults checks URL and returns the configuration with URL in its
// canonical form (no trailing slash) and every unset field at its default.
// kind names the engine in the error ("vllm").
// EngineIdleConnTimeout is how long the default client keeps an idle
// connection to an engine: under the 5 s after which vLLM's, SGLang's and
// TensorRT-LLM's uvicorn servers close one.
const EngineIdleConnTimeout = 4 * time.Second

func (c Config) WithDefaults(kind string) (Config, error) {
	base, err := CheckURL(c.URL)
	if err != nil {
		return c, fmt.Errorf("%s engine url: %w", kind, err)
	}
	c.URL = base
	if c.Role == "" {
		c.Role = kv.RoleAggregated
	}
	if c.DPSize <= 0 {
		c.DPSize = 1
	}
	if c.StatsInterval <= 0 {
		c.StatsInterval = DefaultStatsInterval
	}
	if c.HealthInterval <= 0 {
		c.HealthInterval = DefaultHealthInterval
	}
	if c.Client == nil {
		// Pooled for the many concurrent streams one engine serves. The
		// engines' uvicorn servers close a connection idle for 5 s
		// (timeout_keep_alive): ours let go first, so no request is sent
		// on a connection the engine is closing.
		c.Client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: EngineIdleConnTimeout}}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// HintForm is how a request's KV hint reaches an engine; each adapter says
// what the forms are for its engine and which it takes.
type HintForm string

const (
	// HintNative sends the hint envelope in the engine's own hint field.
	HintNative HintForm = "native"
	// HintBridge sends it in the engine's older, connector-read form.
	HintBridge HintForm = "bridge"
	// HintOff sends none; the worker then declares it takes no hints.
	HintOff HintForm = "off"
)

// WithDefault returns the form, HintNative when unset; a form that is none
// of the three is an error.
func (f HintForm) WithDefault() (HintForm, error) {
	switch f {
	case "":
		return HintNative, nil
	case HintNative, HintBridge, HintOff:
		return f, nil
	}
	return "", fmt.Errorf("%q: want native, bridge or off", string(f))
}
