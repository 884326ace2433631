package remote

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/engine"
)

// ReadFrames ends cleanly at [DONE] or at an end after a finish, and calls
// anything else a lost engine, a frame's error, or a stopped reader.
func TestReadFrames(t *testing.T) {
	type frame struct {
		N    int  `json:"n"`
		Done bool `json:"done"`
	}
	live, cancelled := context.Background(), func() context.Context {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx
	}()
	errBad := errors.New("frame refused")
	for _, tc := range []struct {
		name, body string
		ctx        context.Context
		want       error // nil, ErrStopped, errBad, or engine.ErrUnavailable (lost)
		frames     int
	}{
		{"done", "data: {\"n\":1}\n\ndata: {\"n\":2}\n\ndata: [DONE]\n\n", live, nil, 2},
		{"finished without [DONE]", "data: {\"n\":1,\"done\":true}\n\n", live, nil, 1},
		{"cut short", "data: {\"n\":1}\n\n", live, engine.ErrUnavailable, 1},
		{"bad frame", "data: {\"n\":\n\n", live, engine.ErrUnavailable, 0},
		{"frame error", "data: {\"n\":-1}\n\ndata: [DONE]\n\n", live, errBad, 1},
		{"caller gone", "data: {\"n\":1}\n\n", cancelled, ErrStopped, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			frames, finished := 0, false
			err := ReadFrames(tc.ctx, strings.NewReader(tc.body), func() bool { return finished }, func(f *frame) error {
				frames++
				if f.N < 0 {
					return errBad
				}
				finished = f.Done
				return nil
			})
			if frames != tc.frames || (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("frames %d err %v; want %d, %v", frames, err, tc.frames, tc.want)
			}
		})
	}
}
