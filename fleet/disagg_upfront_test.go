package fleet

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/kv"
)

// upFront makes a recEngine behave as SGLang's legs do: a prefill leg
// answers at once with its transfer parameters on a chunk before the last
// and ends only later; a decode leg can be held.
type upFront struct {
	params []byte
	// wait, on a prefill leg, runs between the up-front chunk and the
	// leg's end.
	wait func(ctx context.Context)
	fail bool          // the prefill leg then ends with no finish: a lost worker
	hold chan struct{} // decode legs pass nothing before it closes
	ends atomic.Int32  // prefill legs that ran to their end
}

func (u *upFront) generate(ctx context.Context, e *recEngine, req *engine.Request, s *seen) (<-chan engine.Chunk, bool) {
	switch req.Leg {
	case kv.LegPrefill:
		out := make(chan engine.Chunk, 1)
		go func() {
			defer close(out)
			out <- engine.Chunk{TransferParams: u.params}
			if u.wait != nil {
				u.wait(ctx)
			}
			if u.fail || ctx.Err() != nil {
				return
			}
			u.ends.Add(1)
			out <- engine.Chunk{Tokens: []kv.Token{1}, Finish: kv.FinishLength, Usage: &engine.Usage{PromptTokens: len(req.Tokens), CompletionTokens: 1}}
		}()
		return out, true
	case kv.LegDecode:
		if u.hold == nil {
			return nil, false
		}
		in, err := e.Engine.Generate(ctx, req)
		if err != nil {
			return nil, false
		}
		out := make(chan engine.Chunk)
		go func() {
			defer close(out)
			select {
			case <-u.hold:
			case <-ctx.Done():
				for range in {
				}
				return
			}
			for c := range in {
				s.decoded += len(c.Tokens)
				select {
				case out <- c:
				case <-ctx.Done():
				}
			}
		}()
		return out, true
	}
	return nil, false
}

// SGLang's way through the prefill-first flow: parameters on a prefill
// chunk before its last start the decode leg at once (the prefill leg
// here ends only after the decode has produced tokens); the decode leg
// gets them whole and no hint; the answer is the decode's. A prefill leg
// that fails before the decode's first token stops the decode leg and the
// request fails as a lost worker (the frontend migrates it).
func TestDisaggParamsUpFront(t *testing.T) {
	f := startPD(t, 1, 1, 0, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	params := []byte(`{"bootstrap_host":"127.0.0.1","bootstrap_port":8998,"bootstrap_room":12345}`)
	decodeRan := make(chan struct{})
	u := &upFront{params: params, wait: func(ctx context.Context) {
		select {
		case <-decodeRan:
		case <-ctx.Done():
		}
	}}
	f.prefill[0].upFront.Store(u)
	f.decode[0].onAnswer = nil
	p := prompt(7, 5000)
	st, err := f.c.Generate(ctx, &kv.GenerateRequest{RequestID: "up", Model: pdModel, Tokens: p, Sampling: kv.Sampling{MaxTokens: 8, Seed: 99}})
	if err != nil {
		t.Fatal(err)
	}
	var got []kv.Token
	for {
		ch, err := st.Recv()
		if err != nil {
			t.Fatalf("up-front P/D: %v", err)
		}
		if len(ch.Tokens) > 0 && len(got) == 0 {
			close(decodeRan) // the prefill leg ends only now
		}
		got = append(got, ch.Tokens...)
		if ch.Finish != kv.FinishNone {
			break
		}
	}
	st.Close()
	if !slices.Equal(got, reference(t, p, 8)) {
		t.Fatalf("answer %v differs from an aggregated engine's", got)
	}
	dec := legsOf(f.decode, "up", kv.LegDecode)
	if len(dec) != 1 || string(dec[0].params) != string(params) || dec[0].hint {
		t.Fatalf("decode leg %+v", dec)
	}
	waitFor(t, 5*time.Second, "the prefill leg ran to its end", func() bool { return u.ends.Load() == 1 })

	// The prefill fails before the decode's first token.
	hold := make(chan struct{})
	defer close(hold)
	f.prefill[0].upFront.Store(&upFront{params: params, fail: true, hold: hold})
	f.decode[0].upFront.Store(&upFront{hold: hold})
	// (The held decode leg would never end by itself: only the fleet
	// stopping it ends the request before ctx does.)
	start := time.Now()
	r := pdTurn(ctx, f.c, "up-fail", prompt(8, 5000), 8)
	if !errors.Is(r.err, kv.ErrWorkerLost) || len(r.toks) != 0 || time.Since(start) > 10*time.Second {
		t.Fatalf("prefill lost after its parameters: %+v after %v, want kv.ErrWorkerLost and no tokens", r, time.Since(start))
	}
}
