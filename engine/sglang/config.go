package sglang

import "github.com/kvmesh/kvmesh/engine/remote"

// Defaults of SGLang's server arguments, assumed when /get_server_info
// does not say.
const (
	DefaultPageSize      = 1    // --page-size
	DefaultBootstrapPort = 8998 // --disaggregation-bootstrap-port
)

// Config configures the adapter to one SGLang server. Role must match the
// server's --disaggregation-mode (null is aggregated); DPSize is SGLang's
// --dp-size (requests name theirs in routed_dp_rank), and 1 takes the
// server's own dp_size; a pinned BlockSize must agree with its
// --page-size; Events is rank 0's --kv-events-config endpoint.
type Config struct {
	remote.Config
	// HintForm is how KV hints reach SGLang: native in GenerateReqInput's
	// kv_hints field (SGLang's native hint surface,
	// sgl-project/sglang#38891), bridge as the older kv_router_hint
	// {source_control_endpoint, block_hashes} with the hashes as SGLang
	// published them (signed), or off; default native.
	HintForm remote.HintForm
	// BootstrapHost is the host a decode server dials for this (prefill)
	// server's KV; "" takes the host of URL, as SGLang's router does.
	BootstrapHost string
}
