package enginetest

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/kv"
)

// Prompt is n consecutive tokens from base.
func Prompt(n int, base kv.Token) []kv.Token {
	out := make([]kv.Token, n)
	for i := range out {
		out[i] = base + kv.Token(i)
	}
	return out
}

// Collect reads a stream to its end, failing the test if that takes over
// 10s: its tokens, its last chunk and every chunk.
func Collect(t testing.TB, ch <-chan engine.Chunk) (toks []kv.Token, last engine.Chunk, chunks []engine.Chunk) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case c, ok := <-ch:
			if !ok {
				return toks, last, chunks
			}
			chunks = append(chunks, c)
			toks = append(toks, c.Tokens...)
			last = c
		case <-timeout:
			t.Fatal("stream did not end")
		}
	}
}

// Open opens an engine with open, which may take 5s (an adapter waits for
// its server's health), and closes it when the test ends.
func Open[E io.Closer](t testing.TB, open func(context.Context) (E, error)) E {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e, err := open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// Serve serves h (an engine stand-in's API) on loopback; when the test
// ends it stops serving, then closes the stand-in.
func Serve(t testing.TB, h http.Handler, standIn io.Closer) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		srv.Close()
		standIn.Close()
	})
	return srv
}
