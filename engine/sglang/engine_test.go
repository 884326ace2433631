package sglang

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/enginetest"
	"github.com/kvmesh/kvmesh/engine/remote"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
)

func TestAttachReadsServerInfo(t *testing.T) {
	s, srv := startMock(t, mockOpts{})
	e := newEngine(t, Config{Config: remote.Config{URL: srv.URL + "/"}})
	c := e.Config()
	if c.Model != testModel || c.BlockSize != 16 || c.Blocks != 512 || e.MaxModelLen() != 8192 || c.Role != kv.RoleAggregated {
		t.Fatalf("config %+v context %d (mock %d)", c, e.MaxModelLen(), s.BootstrapPort())
	}
	ctx := context.Background()
	if _, err := New(ctx, Config{Config: remote.Config{URL: srv.URL, BlockSize: 32}}); err == nil || !strings.Contains(err.Error(), "--page-size 16") {
		t.Fatalf("pinned block size mismatch: %v", err)
	}
	if _, err := New(ctx, Config{Config: remote.Config{URL: srv.URL, Model: "other"}}); err == nil || !strings.Contains(err.Error(), `"other"`) {
		t.Fatalf("unknown model: %v", err)
	}
	// The role must be the server's --disaggregation-mode.
	if _, err := New(ctx, Config{Config: remote.Config{URL: srv.URL, Role: kv.RolePrefill}}); err == nil || !strings.Contains(err.Error(), "--disaggregation-mode null") {
		t.Fatalf("prefill role on an aggregated server: %v", err)
	}
	_, psrv := startMock(t, mockOpts{mode: "prefill"})
	if _, err := New(ctx, Config{Config: remote.Config{URL: psrv.URL}}); err == nil || !strings.Contains(err.Error(), "want --disaggregation-mode null") {
		t.Fatalf("aggregated role on a prefill server: %v", err)
	}
	sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := New(sctx, Config{Config: remote.Config{URL: "http://127.0.0.1:1"}}); err == nil || !strings.Contains(err.Error(), "not healthy") {
		t.Fatalf("dead engine: %v", err)
	}
}

// Cumulative (SGLang's default) and incremental streaming give the same
// tokens, each once.
func TestGenerateCumulativeAndIncremental(t *testing.T) {
	var got [][]kv.Token
	for _, inc := range []bool{false, true} {
		_, srv := startMock(t, mockOpts{incremental: inc, speed: 20})
		e := newEngine(t, Config{Config: remote.Config{URL: srv.URL}})
		if e.incremental() != inc {
			t.Fatalf("incremental %v, server says %v", e.incremental(), inc)
		}
		req := &engine.Request{ID: "r1", Tokens: enginetest.Prompt(40, 100), Sampling: kv.Sampling{MaxTokens: 12, Seed: 7}}
		ch, err := e.Generate(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		toks, last, chunks := enginetest.Collect(t, ch)
		if len(toks) != 12 || last.Finish != kv.FinishLength || len(chunks) < 3 {
			t.Fatalf("incremental=%v: tokens %d finish %q chunks %d", inc, len(toks), last.Finish, len(chunks))
		}
		if u := last.Usage; u == nil || u.PromptTokens != 40 || u.CompletionTokens != 12 {
			t.Fatalf("usage %+v", last.Usage)
		}
		// The same prompt again: its full pages come from the radix cache.
		ch, _ = e.Generate(context.Background(), req)
		toks2, last, _ := enginetest.Collect(t, ch)
		if last.Usage.CachedTokens != 32 || !slices.Equal(toks, toks2) {
			t.Fatalf("cached %d, same tokens %v", last.Usage.CachedTokens, slices.Equal(toks, toks2))
		}
		got = append(got, toks)
	}
	if !slices.Equal(got[0], got[1]) {
		t.Fatal("cumulative and incremental streams differ")
	}
}

// A request the engine refuses is the request's fault (a 4xx the client
// reads); an abort with a 5xx, a refused connection or a cut stream is
// the engine's (migration).
func TestErrorsClassified(t *testing.T) {
	_, srv := startMock(t, mockOpts{})
	// The test repoints the engine (e.cfg.URL): no load reader runs meanwhile.
	e := newEngine(t, Config{Config: remote.Config{URL: srv.URL, StatsInterval: time.Hour}})
	_, err := e.Generate(context.Background(), &engine.Request{Tokens: enginetest.Prompt(9000, 1), Sampling: kv.Sampling{MaxTokens: 4}})
	var rej *remote.RejectedError
	if !errors.As(err, &rej) || rej.Status != 400 || !strings.Contains(rej.Message, "context length") {
		t.Fatalf("too long: %v", err)
	}
	for _, tc := range []struct {
		name, frame string
		rejected    bool
	}{
		{"abort 5xx", `{"text":"","output_ids":[],"meta_info":{"finish_reason":{"type":"abort","message":"KV transfer failed","status_code":500}}}`, false},
		{"abort 4xx", `{"text":"","output_ids":[],"meta_info":{"finish_reason":{"type":"abort","message":"bad input","status_code":400}}}`, true},
		{"stream error", `{"error":{"message":"Input length exceeds"}}`, true},
		{"cut", `{"text":"a","output_ids":[5],"meta_info":{"finish_reason":null,"completion_tokens":1}}`, false},
	} {
		fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/generate" {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Content-Type", "text/event-stream")
			w.Write([]byte("data: " + tc.frame + "\n\n"))
			if tc.name != "cut" {
				w.Write([]byte("data: [DONE]\n\n"))
			}
		}))
		e.cfg.URL = fake.URL
		ch, err := e.Generate(context.Background(), &engine.Request{Tokens: enginetest.Prompt(4, 1), Sampling: kv.Sampling{MaxTokens: 4}})
		if err != nil {
			t.Fatal(err)
		}
		_, last, _ := enginetest.Collect(t, ch)
		rejected := errors.As(last.Err, &rej)
		if last.Err == nil || rejected != tc.rejected || errors.Is(last.Err, engine.ErrUnavailable) == tc.rejected {
			t.Fatalf("%s: err %v (rejected %v)", tc.name, last.Err, rejected)
		}
		fake.Close()
	}
	// A dead server is a lost engine.
	e.cfg.URL = "http://127.0.0.1:1"
	if _, err := e.Generate(context.Background(), &engine.Request{Tokens: enginetest.Prompt(4, 1), Sampling: kv.Sampling{MaxTokens: 4}}); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("dead server: %v", err)
	}
}

// Hints reach SGLang in its forms: the kv_hints envelope (unsigned, the
// envelope's domain) or kv_router_hint with the engine's own signed
// hashes; none on a decode leg, none with --hint-form off.
func TestHintForms(t *testing.T) {
	neg := kv.EngineHash(uint64(1<<63 | 12345))
	hint := &kv.Hint{ID: "sel-1", Endpoint: "tcp://10.0.0.2:7000", Hashes: []kv.EngineHash{neg, 42}}
	for _, form := range []remote.HintForm{remote.HintNative, remote.HintBridge, remote.HintOff} {
		s, srv := startMock(t, mockOpts{})
		e := newEngine(t, Config{Config: remote.Config{URL: srv.URL}, HintForm: form})
		ch, err := e.Generate(context.Background(), &engine.Request{ID: "h-" + string(form), Tokens: enginetest.Prompt(20, 3), Sampling: kv.Sampling{MaxTokens: 2}, KVHint: hint})
		if err != nil {
			t.Fatal(err)
		}
		enginetest.Collect(t, ch)
		recs := s.Hints()
		switch form {
		case remote.HintOff:
			if len(recs) != 0 {
				t.Fatalf("off: %+v", recs)
			}
			continue
		case remote.HintNative:
			if len(recs) != 1 || recs[0].Field != "kv_hints" || recs[0].MessageID != "sel-1" || !slices.Equal(recs[0].BlockHashes, []uint64{uint64(neg), 42}) {
				t.Fatalf("native: %+v", recs)
			}
		case remote.HintBridge:
			if len(recs) != 1 || recs[0].Field != "kv_router_hint" || recs[0].SourceEndpoint != hint.Endpoint ||
				!slices.Equal(recs[0].SignedHashes, []int64{int64(neg), 42}) || recs[0].SignedHashes[0] >= 0 {
				t.Fatalf("bridge: %+v", recs)
			}
			var raw struct {
				BlockHashes []json.Number `json:"block_hashes"`
			}
			_ = json.Unmarshal(recs[0].Envelope, &raw)
			if len(raw.BlockHashes) != 2 || !strings.HasPrefix(string(raw.BlockHashes[0]), "-") {
				t.Fatalf("bridge wire: %s", recs[0].Envelope)
			}
		}
	}
}

func TestLoadFromMetrics(t *testing.T) {
	_, srv := startMock(t, mockOpts{speed: 1})
	e := newEngine(t, Config{Config: remote.Config{URL: srv.URL}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := e.Generate(ctx, &engine.Request{Tokens: enginetest.Prompt(64, 7), Sampling: kv.Sampling{MaxTokens: 4000}})
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "load from /metrics", func() bool {
		s := e.Stats()
		return s.Running == 1 && s.UsedBlocks > 0 && s.TotalBlocks == 512
	})
	cancel()
	for range ch {
	}
	// SGLang aborts a request whose client went away.
	testutil.WaitFor(t, 10*time.Second, "abort on disconnect", func() bool { return e.Stats().Running == 0 })
}

func TestNewRoomCongruent(t *testing.T) {
	for range 100 {
		for _, dp := range []int{1, 3, 8} {
			for rank := range dp {
				r := NewRoom(rank, dp)
				if r > maxRoom || int(r%uint64(dp)) != rank {
					t.Fatalf("room %d for rank %d of %d", r, rank, dp)
				}
			}
		}
	}
}
