package fleet

// HTTP helpers for the tests that drive the fleet through the frontend
// (sampling_test.go, stall_e2e_test.go); frontend's own tests keep theirs.

import (
	"github.com/kvmesh/kvmesh/frontend"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// servedModels is what the frontend serves in front of the fleet.
func servedModels(ms ...*frontend.Model) *frontend.StaticModels {
	var s frontend.StaticModels
	for _, m := range ms {
		s.Add(m)
	}
	return &s
}

// The OpenAI client-side helpers shared with the other packages' tests.
var (
	post       = testutil.Post
	sseEvents  = testutil.SSEEvents
	chatDeltas = testutil.ChatDeltas
)
