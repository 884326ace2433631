package main

import (
	"context"

	"github.com/kvmesh/kvmesh/engine/remote"
	"github.com/kvmesh/kvmesh/engine/vllm"
)

func init() { engineAdapters["vllm"] = engineAdapter{open: openVLLM} }

// openVLLM attaches to one vLLM server.
func openVLLM(ctx context.Context, a engineAttach) (attachedEngine, error) {
	return vllm.New(ctx, vllm.Config{Config: a.remote(), HintForm: remote.HintForm(a.opts.hintForm),
		Transfer: vllm.Transfer(a.opts.kvTransfer)})
}
