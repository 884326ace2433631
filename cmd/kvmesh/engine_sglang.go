package main

import (
	"context"

	"github.com/kvmesh/kvmesh/engine/remote"
	"github.com/kvmesh/kvmesh/engine/sglang"
)

// SGLang's decode servers take only requests paired with a prefill by a
// bootstrap room: no local prefill on them.
func init() { engineAdapters["sglang"] = engineAdapter{open: openSGLang, decodeCannotPrefill: true} }

// openSGLang attaches to one SGLang server.
func openSGLang(ctx context.Context, a engineAttach) (attachedEngine, error) {
	return sglang.New(ctx, sglang.Config{Config: a.remote(), HintForm: remote.HintForm(a.opts.hintForm)})
}
