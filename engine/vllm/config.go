package vllm

import (
	"fmt"

	"github.com/kvmesh/kvmesh/engine/remote"
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

// Config configures the adapter to one vLLM server. DPSize is vLLM's
// --data-parallel-size (requests name their rank in the
// X-data-parallel-rank header); a pinned BlockSize must agree with
// /metrics' vllm:cache_config_info; Events is rank 0's --kv-events-config
// endpoint.
type Config struct {
	remote.Config
	HintForm HintForm // default native
}
