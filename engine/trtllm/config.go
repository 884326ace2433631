package trtllm

import (
	"fmt"
	"time"

	"github.com/kvmesh/kvmesh/engine/remote"
)

// DefaultBlockSize is TensorRT-LLM's default tokens_per_block, assumed when
// the server's iteration stats do not report it and none is pinned.
const DefaultBlockSize = 32

// Config configures the adapter to one trtllm-serve. It is one rank to
// kvmesh (DPSize 1); a pinned BlockSize must agree with
// kvCacheStats.tokensPerBlock in /metrics; Events is the base URL whose
// POST /kv_cache_events is polled (normally URL itself), so ReplayEvents
// and Topic, which are ZMQ's, stay empty.
type Config struct {
	remote.Config
	// PollInterval is how often the events are polled; default 100ms.
	PollInterval time.Duration
	// EventsHintAfter is how many finished generations without a single
	// KV event make the adapter say the engine's event buffer is off;
	// default 8.
	EventsHintAfter int
}

// CheckHintForm refuses every hint form but off: trtllm-serve's request
// models forbid fields they do not define, and none carries a KV hint.
func CheckHintForm(s string) error {
	if s == "" || s == string(remote.HintOff) {
		return nil
	}
	return fmt.Errorf("%q: TensorRT-LLM's requests have no KV hint field (its OpenAI protocol refuses unknown fields), so the only form is off", s)
}
