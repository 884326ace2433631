package transfer

import (
	"context"
	"errors"
	"sync"
	"testing"
)

// releasingSource is a MemSource that pins handoffs by id.
type releasingSource struct {
	*MemSource
	mu    sync.Mutex
	pins  map[string]bool
	calls []string
}

func (s *releasingSource) ReleaseHandoff(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, id)
	ok := s.pins[id]
	delete(s.pins, id)
	return ok
}

// TestReleaseUnpinsAndKeepsTheConnection: a release of a pinned handoff
// answers true, a second one (or an unknown id) false without an error,
// and the connection carries a fetch afterwards.
func TestReleaseUnpinsAndKeepsTheConnection(t *testing.T) {
	src := &releasingSource{MemSource: NewMemSource(testLayers, testLayerSize), pins: map[string]bool{"req-1": true}}
	hs := hashes(100, 3)
	src.Add(hs...)
	ep := startServer(t, &Server{Source: src})
	c := newClient(t, ClientOptions{})
	ctx := context.Background()
	if ok, err := c.Release(ctx, ep, "req-1"); !ok || err != nil {
		t.Fatalf("first release: %v %v", ok, err)
	}
	if ok, err := c.Release(ctx, ep, "req-1"); ok || err != nil {
		t.Fatalf("second release: %v %v, want false without an error", ok, err)
	}
	res, err := c.Fetch(ctx, ep, FetchRequest{Hashes: hs})
	if err != nil {
		t.Fatal(err)
	}
	checkBlocks(t, res, hs)
	res.Release()
	src.mu.Lock()
	defer src.mu.Unlock()
	if len(src.calls) != 2 || src.calls[0] != "req-1" {
		t.Fatalf("source saw releases %v", src.calls)
	}
}

// TestReleaseRefusedBySourceWithoutHandoffs: a source that pins no
// handoffs refuses a release as a bad request; the caller gets an error
// it may ignore, and fetches still work.
func TestReleaseRefusedBySourceWithoutHandoffs(t *testing.T) {
	src := NewMemSource(testLayers, testLayerSize)
	hs := hashes(7, 2)
	src.Add(hs...)
	ep := startServer(t, &Server{Source: src})
	c := newClient(t, ClientOptions{})
	ok, err := c.Release(context.Background(), ep, "x")
	var re *RemoteError
	if ok || !errors.As(err, &re) || re.Code != CodeBadRequest {
		t.Fatalf("release at a source without handoffs: %v %v", ok, err)
	}
	if _, err := c.Release(context.Background(), ep, ""); err == nil {
		t.Fatal("an empty handoff id was sent")
	}
	res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: hs})
	if err != nil {
		t.Fatal(err)
	}
	checkBlocks(t, res, hs)
	res.Release()
}

// FuzzDecodeRelease: never panics, accepts only ids that fill the frame,
// and re-encodes what it accepts to the same bytes.
func FuzzDecodeRelease(f *testing.F) {
	f.Add(appendRelease(nil, 1, "req-1")[headerLen:])
	f.Add([]byte{0, 0})
	f.Add([]byte{0xff, 0xff, 'a'})
	f.Fuzz(func(t *testing.T, p []byte) {
		id, err := decodeRelease(p)
		if err != nil {
			return
		}
		if len(id) == 0 || len(id) > MaxHandoffIDLen {
			t.Fatalf("accepted an id of %d bytes", len(id))
		}
		if again := appendRelease(nil, 0, id)[headerLen:]; string(again) != string(p) {
			t.Fatal("re-encoding differs")
		}
	})
}
