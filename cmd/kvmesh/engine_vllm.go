package main

import (
	"context"
	"encoding/json"

	"github.com/kvmesh/kvmesh/engine/remote"
	"github.com/kvmesh/kvmesh/engine/vllm"
	"github.com/kvmesh/kvmesh/kv"
)

func init() {
	engineAdapters["vllm"] = engineAdapter{open: openVLLM, connectorConfig: vllmConnectorJSON}
}

// vllmConnectorJSON is vllm serve's --kv-transfer-config for a kvmesh
// worker with --connector kvbm: kvmesh's own connector (python/), a thin
// client of this worker's sidecar at its socket.
func vllmConnectorJSON(k *kvbmFlags, _ kv.Role) string {
	b, _ := json.Marshal(map[string]any{
		"kv_connector":              "KvmeshConnector",
		"kv_connector_module_path":  "kvmesh_kvbm.vllm",
		"kv_role":                   "kv_both",
		"kv_connector_extra_config": map[string]any{"socket": k.socketPath()},
	})
	return string(b) + "\n"
}

// openVLLM attaches to one vLLM server.
func openVLLM(ctx context.Context, a engineAttach) (attachedEngine, error) {
	return vllm.New(ctx, vllm.Config{Config: a.remote(), HintForm: remote.HintForm(a.opts.hintForm),
		Transfer: vllm.Transfer(a.opts.kvTransfer)})
}
