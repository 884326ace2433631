package vllm

import "github.com/kvmesh/kvmesh/engine/remote"

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
	// HintForm is how KV hints reach vLLM: native in the request's
	// top-level kv_hints field (vLLM's native hint surface), bridge as
	// kv_transfer_params.kv_hint (for vLLM builds whose connector reads
	// hints from its parameters), or off; default native.
	HintForm remote.HintForm
}
