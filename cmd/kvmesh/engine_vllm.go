package main

import (
	"context"

	"github.com/kvmesh/kvmesh/engine/vllm"
)

func init() { engineAdapters["vllm"] = engineAdapter{open: openVLLM} }

// openVLLM attaches to one vLLM server.
func openVLLM(ctx context.Context, a engineAttach) (attachedEngine, error) {
	form, err := vllm.ParseHintForm(a.opts.hintForm)
	if err != nil {
		return nil, err
	}
	return vllm.New(ctx, vllm.Config{Config: a.remote(), HintForm: form})
}
