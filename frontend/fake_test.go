package frontend

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/kvmesh/kvmesh/kv"
)

// Test doubles: a byte-level model (token = byte, EOS = 256) and a backend
// whose "worker" replies with a fixed text, one byte per token, continuing
// from wherever the request's tokens end — so a migrated request continues
// exactly where the dead worker stopped.

const testEOS = 256

type byteDetok struct{ buf []byte }

func (d *byteDetok) Add(id uint32) string {
	if id > 255 {
		return ""
	}
	d.buf = append(d.buf, byte(id))
	n := 0
	for n < len(d.buf) {
		r, size := utf8.DecodeRune(d.buf[n:])
		if r == utf8.RuneError && size <= 1 {
			if !utf8.FullRune(d.buf[n:]) {
				break // wait for the rest of this character
			}
		}
		n += size
	}
	out := string(d.buf[:n])
	d.buf = d.buf[n:]
	return out
}

func (d *byteDetok) Flush() string { s := string(d.buf); d.buf = nil; return s }

func byteTokens(s string) []uint32 {
	out := make([]uint32, len(s))
	for i := range len(s) {
		out[i] = uint32(s[i])
	}
	return out
}

func testModel() *Model {
	return &Model{
		Name:    "test-model",
		Created: 1,
		Encode:  byteTokens,
		EncodeChat: func(msgs []Message) ([]uint32, error) {
			var s string
			for _, m := range msgs {
				s += "<" + m.Role + ">" + m.Content
			}
			return byteTokens(s + "<assistant>"), nil
		},
		NewDetokenizer:   func() Detokenizer { return &byteDetok{} },
		EOS:              []uint32{testEOS},
		DefaultMaxTokens: 64,
		VocabSize:        testEOS + 1,
	}
}

type models []*Model

func (ms models) Model(name string) (*Model, bool) {
	for _, m := range ms {
		if m.Name == name {
			return m, true
		}
	}
	return nil, false
}
func (ms models) Models() []*Model { return ms }

type fakeBackend struct {
	mu       sync.Mutex
	reply    string
	prompts  map[string]int // request id → first prompt length
	requests []kv.GenerateRequest
	// dieAfter[attempt] = tokens a worker emits before dying on that attempt.
	dieAfter  map[int]int
	err       error         // returned by Generate
	delay     time.Duration // between tokens
	started   chan struct{} // closed on the first Generate, if set
	cancelled chan struct{} // closed when a stream's ctx is cancelled, if set
	// maxContext is what the fake's workers hold (MaxContext; 0: unknown).
	maxContext int
	// recvErr, if set, is the first Recv's error (a worker's rejection).
	recvErr error
}

func (b *fakeBackend) MaxContext(string) int { return b.maxContext }

func (b *fakeBackend) Generate(ctx context.Context, req *kv.GenerateRequest) (kv.TokenStream, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.prompts == nil {
		b.prompts = map[string]int{}
	}
	b.requests = append(b.requests, *req)
	if b.started != nil {
		select {
		case <-b.started:
		default:
			close(b.started)
		}
	}
	if b.err != nil {
		return nil, b.err
	}
	pl, ok := b.prompts[req.RequestID]
	if !ok {
		pl = len(req.Tokens)
		b.prompts[req.RequestID] = pl
	}
	die := -1
	if n, ok := b.dieAfter[req.Attempt]; ok {
		die = n
	}
	return &fakeStream{ctx: ctx, b: b, req: *req, pos: len(req.Tokens) - pl, die: die, err: b.recvErr}, nil
}

type fakeStream struct {
	ctx     context.Context
	b       *fakeBackend
	req     kv.GenerateRequest
	pos     int // position in the reply
	emitted int
	die     int
	done    bool
	err     error
}

func (s *fakeStream) Recv() (kv.TokenChunk, error) {
	if s.done {
		return kv.TokenChunk{}, io.EOF
	}
	if s.err != nil {
		s.done = true
		return kv.TokenChunk{}, s.err
	}
	if s.b.delay > 0 {
		select {
		case <-time.After(s.b.delay):
		case <-s.ctx.Done():
			if s.b.cancelled != nil {
				close(s.b.cancelled)
			}
			return kv.TokenChunk{}, s.ctx.Err()
		}
	}
	if s.die >= 0 && s.emitted == s.die {
		return kv.TokenChunk{}, fmt.Errorf("stream broke: %w", kv.ErrWorkerLost)
	}
	if s.emitted == s.req.MaxTokens {
		s.done = true
		return kv.TokenChunk{Finish: "length", PromptTokens: len(s.req.Tokens), CachedTokens: 3}, nil
	}
	if s.pos >= len(s.b.reply) {
		s.done = true
		return kv.TokenChunk{Tokens: []uint32{testEOS}, Finish: "stop", PromptTokens: len(s.req.Tokens), CachedTokens: 3}, nil
	}
	tok := uint32(s.b.reply[s.pos])
	s.pos++
	s.emitted++
	return kv.TokenChunk{Tokens: []uint32{tok}}, nil
}

func (s *fakeStream) Close() error { return nil }
