package sim

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/clock"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/kv"
)

func mustEngine(t *testing.T, cfg Config) *Engine {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// collect reads a stream to its end.
func collect(t *testing.T, ch <-chan engine.Chunk) ([]kv.Token, engine.Chunk) {
	t.Helper()
	var toks []kv.Token
	var last engine.Chunk
	timeout := time.After(10 * time.Second)
	for {
		select {
		case c, ok := <-ch:
			if !ok {
				return toks, last
			}
			toks = append(toks, c.Tokens...)
			last = c
		case <-timeout:
			t.Fatal("stream did not end")
		}
	}
}

// TestDeterministicAcrossEngines: the same seed and prompt give the same
// tokens on two engines with different worker keys and loads; a different
// seed gives different tokens.
func TestDeterministicAcrossEngines(t *testing.T) {
	cfgA := DefaultConfig()
	cfgA.SpeedupRatio = 0
	cfgB := cfgA
	cfgB.Worker = kv.WorkerKey{Instance: 2}
	cfgB.MaxBatchedTokens = 100 // different chunking must not matter
	a, b := mustEngine(t, cfgA), mustEngine(t, cfgB)
	prompt := make([]kv.Token, 300)
	for i := range prompt {
		prompt[i] = kv.Token(i * 31)
	}
	ctx := context.Background()
	run := func(e *Engine, seed uint64) ([]kv.Token, engine.Chunk) {
		ch, err := e.Generate(ctx, &engine.Request{ID: "d", Tokens: prompt, Sampling: kv.Sampling{MaxTokens: 150, Seed: seed}})
		if err != nil {
			t.Fatal(err)
		}
		return collect(t, ch)
	}
	// Load b with another request at the same time.
	chB2, _ := b.Generate(ctx, &engine.Request{ID: "noise", Tokens: prompt[:77], Sampling: kv.Sampling{MaxTokens: 90, Seed: 5}})
	ta, last := run(a, 42)
	tb, _ := run(b, 42)
	collect(t, chB2)
	if len(ta) != 150 || last.Finish != kv.FinishLength || last.Usage == nil || last.Usage.CompletionTokens != 150 || last.Usage.PromptTokens != 300 {
		t.Fatalf("a: %d tokens, last chunk %+v", len(ta), last)
	}
	if !slices.Equal(ta, tb) {
		t.Fatal("same seed and prompt differ across engines")
	}
	if want := refOutput(prompt, 42, "", "", 150, cfgA.BlockSize, uint32(cfgA.VocabSize), nil); !slices.Equal(ta, want) {
		t.Fatal("engine output differs from the reference model")
	}
	for _, tok := range ta {
		if int(tok) >= cfgA.VocabSize {
			t.Fatalf("token %d outside the vocabulary", tok)
		}
	}
	if tc, _ := run(a, 43); slices.Equal(ta, tc) {
		t.Fatal("a different seed gave the same tokens")
	}
	// Repeating the prompt on a hits its cached prefix.
	_, last = run(a, 42)
	if last.Usage.CachedTokens != 256 {
		t.Fatalf("repeat cached %d tokens, want 256", last.Usage.CachedTokens)
	}
}

// TestCancellationFreesBlocks runs on a virtual clock: the request is in
// flight (its pass "sleeping"), the caller cancels, and its blocks return.
func TestCancellationFreesBlocks(t *testing.T) {
	vc := clock.NewVirtual(time.Time{})
	cfg := DefaultConfig()
	cfg.Clock = vc
	e := mustEngine(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	prompt := make([]kv.Token, 1000)
	ch, err := e.Generate(ctx, &engine.Request{ID: "c", Tokens: prompt, Sampling: kv.Sampling{MaxTokens: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	wait, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	// Let the first pass (prefill, first token) complete, then the second start.
	if err := vc.BlockUntil(wait, 1); err != nil {
		t.Fatal(err)
	}
	vc.Advance(time.Second)
	first := <-ch
	if len(first.Tokens) != 1 || first.Finish != kv.FinishNone {
		t.Fatalf("first chunk %+v", first)
	}
	if err := vc.BlockUntil(wait, 1); err != nil {
		t.Fatal(err)
	}
	if st := e.Stats(); st.Running != 1 || st.UsedBlocks != 16 {
		t.Fatalf("in flight: %+v", st)
	}
	cancel()
	for c := range ch {
		if c.Finish != kv.FinishCancelled && c.Finish != kv.FinishNone {
			t.Fatalf("chunk after cancel: %+v", c)
		}
	}
	if st := e.Stats(); st.Running != 0 || st.Waiting != 0 || st.UsedBlocks != 0 {
		t.Fatalf("after cancel: %+v", st)
	}
	if ct := e.Counters(); ct.Aborted != 1 {
		t.Fatalf("counters %+v", ct)
	}
	// The 15 full prompt blocks stay cached for reuse.
	if got := e.Lookup(kv.SeqHashes(nil, kv.NewHasher(64, "", "").Local(prompt))); got != 15 {
		t.Fatalf("%d prompt blocks cached after cancel, want 15", got)
	}
}

func TestCloseEndsStreams(t *testing.T) {
	vc := clock.NewVirtual(time.Time{})
	cfg := DefaultConfig()
	cfg.Clock = vc
	e := mustEngine(t, cfg)
	ch, err := e.Generate(context.Background(), &engine.Request{ID: "x", Tokens: []kv.Token{1, 2, 3}, Sampling: kv.Sampling{MaxTokens: 100}})
	if err != nil {
		t.Fatal(err)
	}
	wait, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	if err := vc.BlockUntil(wait, 1); err != nil {
		t.Fatal(err)
	}
	e.Close()
	_, last := collect(t, ch)
	if last.Finish != kv.FinishError || !errors.Is(last.Err, engine.ErrClosed) {
		t.Fatalf("last chunk after Close: %+v", last)
	}
	if _, err := e.Generate(context.Background(), &engine.Request{ID: "y", Tokens: []kv.Token{1}, Sampling: kv.Sampling{MaxTokens: 1}}); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("Generate after Close: %v", err)
	}
	if _, err := e.Generate(context.Background(), &engine.Request{ID: "z", Sampling: kv.Sampling{MaxTokens: 1}}); err == nil {
		t.Fatal("an empty prompt was accepted")
	}
}

// TestEngineManyConcurrent: many concurrent streams, stop tokens, events to
// a sink, all finishing with exactly the reference output; the replayed
// events match the pool when idle.
func TestEngineManyConcurrent(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SpeedupRatio = 0
	cfg.Blocks = 256
	cfg.BlockSize = 16
	cfg.VocabSize = 500
	e := mustEngine(t, cfg)
	h := newHoldings(t, cfg.Worker, cfg.BlockSize)
	var hmu sync.Mutex
	e.SetEventSink(func(b []kv.Event) { hmu.Lock(); h.sink(b); hmu.Unlock() })
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for i := 0; i < 48; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			prompt := make([]kv.Token, 40+i*7)
			for j := range prompt {
				prompt[j] = kv.Token((j * (1 + i%3)) % 500)
			}
			rq := &engine.Request{ID: "m", Tokens: prompt, Sampling: kv.Sampling{MaxTokens: 5 + i, Seed: uint64(i), StopTokens: []kv.Token{kv.Token(i)}}}
			ch, err := e.Generate(context.Background(), rq)
			if err != nil {
				errs <- err.Error()
				return
			}
			var got []kv.Token
			var last engine.Chunk
			for c := range ch {
				got = append(got, c.Tokens...)
				last = c
			}
			want := refOutput(prompt, uint64(i), "", "", 5+i, cfg.BlockSize, uint32(cfg.VocabSize), rq.StopTokens)
			wantFin := kv.FinishLength
			if len(want) < 5+i {
				wantFin = kv.FinishStop
			}
			if !slices.Equal(got, want) || last.Finish != wantFin {
				errs <- "request output or finish differs from the reference"
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	hmu.Lock()
	defer hmu.Unlock()
	if err := h.matches(e.core); err != nil {
		t.Fatal(err)
	}
	checkPool(t, e.core, nil)
}

// TestCloseCancelsFetch: a fetch blocked on a peer ends when the engine
// closes, and the stream reports ErrClosed.
func TestCloseCancelsFetch(t *testing.T) {
	cfg := DefaultConfig()
	entered := make(chan struct{})
	cfg.Fetcher = func(ctx context.Context, _ *engine.Request, _ Missing, _ Inserter) error {
		close(entered)
		<-ctx.Done()
		return ctx.Err()
	}
	e := mustEngine(t, cfg)
	ch, err := e.Generate(context.Background(), &engine.Request{ID: "f", Tokens: make([]kv.Token, 200), Sampling: kv.Sampling{MaxTokens: 2}})
	if err != nil {
		t.Fatal(err)
	}
	<-entered
	e.Close()
	_, last := collect(t, ch)
	if !errors.Is(last.Err, engine.ErrClosed) {
		t.Fatalf("last chunk %+v", last)
	}
	if ct := e.Counters(); ct.FetchCalls != 1 || ct.FetchErrors != 1 {
		t.Fatalf("counters %+v", ct)
	}
}
