package remote

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/engine"
)

// TestStreamError: an error object inside a stream is classified by the
// same rule as an HTTP status.
func TestStreamError(t *testing.T) {
	for _, c := range []struct {
		raw      string
		rejected int // 0: lost
		msg      string
	}{
		{`{"message":"prompt too long","code":400}`, 400, "prompt too long"},
		{`{"message":"bad","code":"422"}`, 422, "bad"},
		{`{"message":"slow down","code":429}`, 0, "slow down"},
		{`{"message":"timeout","code":408}`, 0, "timeout"},
		{`{"message":"oom","code":500}`, 0, "oom"},
		{`{"message":"no code"}`, 0, "no code"},
		{`"plain words"`, 0, "plain words"},
	} {
		err := StreamError(json.RawMessage(c.raw))
		var rej *RejectedError
		if got := errors.As(err, &rej); got != (c.rejected != 0) || got && rej.Status != c.rejected {
			t.Errorf("%s: %v, want rejected with %d", c.raw, err, c.rejected)
		}
		if c.rejected == 0 && !errors.Is(err, engine.ErrUnavailable) {
			t.Errorf("%s: %v, want engine.ErrUnavailable", c.raw, err)
		}
		if !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %q lacks %q", c.raw, err, c.msg)
		}
	}
}
