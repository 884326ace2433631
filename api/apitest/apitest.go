// Package apitest holds what tests share to drive the worker API directly.
// It imports only api; nothing outside tests should use it.
package apitest

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/api"
)

// GenerateUsage runs req on c to the end of its stream (10 s at most) and
// returns the usage of its last chunk; a stream error or an error chunk
// fails the test.
func GenerateUsage(t testing.TB, c api.WorkerClient, req *api.GenerateRequest) *api.Usage {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.Generate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var u *api.Usage
	for {
		ch, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return u
		}
		if err != nil {
			t.Fatal(err)
		}
		if ch.Error != "" {
			t.Fatal(ch.Error)
		}
		if ch.Usage != nil {
			u = ch.Usage
		}
	}
}

// Drain reads st to its end and returns every token it carried and its
// last chunk; a stream error fails the test.
func Drain(t testing.TB, st api.Worker_GenerateClient) (tokens []uint32, last *api.GenerateChunk) {
	t.Helper()
	for {
		ch, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return tokens, last
		}
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, ch.Tokens...)
		last = ch
	}
}
