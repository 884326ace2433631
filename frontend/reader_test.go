package frontend

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// listStream yields its chunks in order, each after wait.
type listStream struct {
	chunks []kv.TokenChunk
	wait   time.Duration
	closed bool
}

func (s *listStream) Recv() (kv.TokenChunk, error) {
	if len(s.chunks) == 0 {
		return kv.TokenChunk{}, io.EOF
	}
	if s.wait > 0 {
		time.Sleep(s.wait)
	}
	ch := s.chunks[0]
	s.chunks = s.chunks[1:]
	return ch, nil
}

func (s *listStream) Close() error { s.closed = true; return nil }

func tokenChunks(n int) []kv.TokenChunk {
	out := make([]kv.TokenChunk, n)
	for i := range out {
		out[i] = kv.TokenChunk{Tokens: []uint32{uint32(i)}}
	}
	out[n-1].Finish = "length"
	return out
}

// readAll drains r, spending work on each chunk (the client's write), and
// checks every chunk arrives once, in order.
func readAll(t *testing.T, r *chunkReader, n int, work time.Duration) {
	t.Helper()
	for i := range n {
		if work > 0 {
			time.Sleep(work)
		}
		ch, err := r.next()
		if err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
		if len(ch.Tokens) != 1 || ch.Tokens[0] != uint32(i) {
			t.Fatalf("chunk %d carries %v", i, ch.Tokens)
		}
	}
}

// A client that keeps up is served from the handler's goroutine, flushing
// before every wait; one that falls behind gets a pump, and the ready
// chunks are then written before a single flush.
func TestChunkReaderPumpsOnlyWhenBehind(t *testing.T) {
	t.Run("keeping up", func(t *testing.T) {
		flushes := 0
		r := &chunkReader{ctx: context.Background(), stream: &listStream{chunks: tokenChunks(20), wait: time.Millisecond},
			flush: func() error { flushes++; return nil }}
		readAll(t, r, 20, 0)
		r.stop()
		if r.pump != nil {
			t.Fatal("a pump started although every chunk had to be waited for")
		}
		if flushes != 20 {
			t.Fatalf("%d flushes for 20 chunks that each had to be waited for", flushes)
		}
	})
	t.Run("behind", func(t *testing.T) {
		flushes := 0
		r := &chunkReader{ctx: context.Background(), stream: &listStream{chunks: tokenChunks(200)},
			flush: func() error { flushes++; return nil }}
		readAll(t, r, 200, 50*time.Microsecond)
		r.stop()
		if r.pump == nil {
			t.Fatal("no pump although every chunk was waiting")
		}
		if flushes > 20 {
			t.Fatalf("%d flushes for 200 chunks that were all ready", flushes)
		}
	})
	t.Run("not streaming", func(t *testing.T) {
		r := &chunkReader{ctx: context.Background(), stream: &listStream{chunks: tokenChunks(50)}}
		readAll(t, r, 50, 0)
		if r.pump != nil {
			t.Fatal("a pump started for a non-streaming request")
		}
	})
}

// polledList is a listStream whose first ready chunks are waiting (TryRecv
// hands them out) and whose others must be waited for (Recv).
type polledList struct {
	listStream
	ready int // chunks at the front that are already waiting
}

func (s *polledList) TryRecv() (kv.TokenChunk, bool, error) {
	if s.ready == 0 || len(s.chunks) == 0 {
		return kv.TokenChunk{}, false, nil
	}
	s.ready--
	ch, err := s.listStream.Recv()
	return ch, true, err
}

// A stream that says whether a chunk is waiting gets no pump: the waiting
// chunks are written before one flush, and a chunk that had to be waited
// for is preceded by a flush of everything before it.
func TestChunkReaderPolled(t *testing.T) {
	st := &polledList{listStream: listStream{chunks: tokenChunks(30)}, ready: 10}
	flushes := 0
	flushedAt := []int{} // chunks handed out when each flush happened
	got := 0
	r := &chunkReader{ctx: context.Background(), stream: st, polled: st,
		flush: func() error { flushes++; flushedAt = append(flushedAt, got); return nil }}
	for i := range 30 {
		ch, err := r.next()
		if err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
		if len(ch.Tokens) != 1 || ch.Tokens[0] != uint32(i) {
			t.Fatalf("chunk %d carries %v", i, ch.Tokens)
		}
		got++
	}
	r.stop()
	if r.pump != nil {
		t.Fatal("a pump started for a polled stream")
	}
	// 10 waiting: no flush until they are all handed out; then one flush
	// before each of the 20 waited for.
	if flushes != 20 || flushedAt[0] != 10 {
		t.Fatalf("%d flushes, the first after %d chunks; want 20, the first after the 10 waiting", flushes, flushedAt[0])
	}
}
