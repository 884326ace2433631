package vllm

import (
	"fmt"

	"github.com/kvmesh/kvmesh/engine/remote"
)

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
	// Transfer is how the engine's KV connector hands a prefill's KV to a
	// decode engine; default TransferParams.
	Transfer Transfer
}

// Transfer is how a vLLM prefill engine's KV connector hands the prompt's
// KV to the decode engine, which decides when a prefill leg is followed by
// a decode leg.
type Transfer string

const (
	// TransferParams: the connector answers a prefill cut at its one token
	// with kv_transfer_params naming its blocks (NixlConnector and its
	// kin), which the decode leg carries whole; a prefill answered without
	// them is final.
	TransferParams Transfer = "params"
	// TransferSharedStorage: the connector saves the prompt's KV to
	// storage the decode engine reads too, found there by the prompt's
	// tokens (vLLM's ExampleConnector with one shared_storage_path), and
	// answers with no parameters. A prefill cut at its one token then
	// answers SharedStorageParams, so a decode leg follows and carries
	// them; the connector ignores them.
	TransferSharedStorage Transfer = "shared-storage"
)

// SharedStorageParams are the parameters a prefill leg answers under
// TransferSharedStorage: kvmesh's, not the connector's, saying where the
// KV went.
const SharedStorageParams = `{"kvmesh_kv_transfer":"shared-storage"}`

// WithDefault is t, or TransferParams when unset; an unknown value is an
// error.
func (t Transfer) WithDefault() (Transfer, error) {
	switch t {
	case "":
		return TransferParams, nil
	case TransferParams, TransferSharedStorage:
		return t, nil
	}
	return "", fmt.Errorf("%q: want %s or %s", string(t), TransferParams, TransferSharedStorage)
}
