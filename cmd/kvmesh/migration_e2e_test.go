package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/api/apitest"
	"github.com/kvmesh/kvmesh/frontend"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/natsbus"
)

// TestMigrationAcrossWorkerProcesses: embedded NATS here, two `kvmesh
// worker` processes and a `kvmesh frontend` process. A stream whose worker
// is killed mid-generation continues on the other worker, and the client
// sees exactly the text an uninterrupted run with the same seed produces.
// Direct gRPC calls show each worker alone produces that text too.
func TestMigrationAcrossWorkerProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvmesh processes")
	}
	ns, err := natsbus.StartEmbedded(natsbus.EmbeddedConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()

	// ~6 ms per token: a 200-token stream lasts about a second.
	workers := map[string]*testutil.Proc{}
	for range 2 {
		p := startProc(t, "kvmesh worker", "worker", "--nats", ns.URL(), "--speedup-ratio", "1", "--log-level", "warn")
		m := p.Expect(workerLine, 20*time.Second)
		workers[m[2]] = p
	}
	fe := startProc(t, "kvmesh frontend", "frontend", "--nats", ns.URL(), "--listen", "127.0.0.1:0", "--log-level", "warn")
	base := fe.Expect(frontendLine, 20*time.Second)[1]
	ws := watchWorkers(t, ns.URL(), simModel, 2)
	testutil.WaitFor(t, 10*time.Second, "frontend /health", func() bool {
		resp, err := http.Get(strings.TrimSuffix(base, "/v1") + "/health")
		if err != nil {
			return false
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	client := newClient(base)
	ctx := context.Background()
	const content, seed, maxTok = "Migrate me, please.", 777, 200
	ref, err := streamChat(ctx, client, chatParams(content, seed, maxTok))
	if err != nil {
		t.Fatal(err)
	}
	if ref.finish != "length" || ref.usage == nil || ref.usage.CompletionTokens != maxTok {
		t.Fatalf("reference run: finish %q usage %+v", ref.finish, ref.usage)
	}

	// Same seed, same prompt on each worker directly: same text.
	prompt := chatPromptTokens(t, simModel, frontend.Message{Role: "user", Content: content})
	model, _ := frontend.BuiltinModel(simModel)
	for _, in := range ws.watcher.Instances() {
		c, err := ws.clients.Get(in)
		if err != nil {
			t.Fatal(err)
		}
		st, err := c.Generate(ctx, &api.GenerateRequest{RequestId: "direct-" + in.GRPCAddr, Tokens: prompt, MaxTokens: maxTok,
			StopTokenIds: model.EOS, Seed: seed, Temperature: 1})
		if err != nil {
			t.Fatal(err)
		}
		ids, _ := apitest.Drain(t, st)
		if got := decode(t, simModel, ids); got != ref.text {
			t.Errorf("worker %s directly: %q\nthrough the frontend: %q", in.GRPCAddr, got, ref.text)
		}
	}

	// The migration run: kill the worker serving the stream a fifth of the
	// way in.
	testutil.WaitFor(t, 15*time.Second, "idle workers", func() bool { n, _ := ws.running(t); return n == 0 })
	p := chatParams(content, seed, maxTok)
	p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	st := client.Chat.Completions.NewStreaming(ctx, p)
	defer st.Close()
	var text strings.Builder
	var finish string
	var usage *openai.CompletionUsage
	chunks, killed := 0, ""
	for st.Next() {
		ch := st.Current()
		for _, c := range ch.Choices {
			if c.Delta.Content != "" {
				chunks++
				text.WriteString(c.Delta.Content)
			}
			if c.FinishReason != "" {
				finish = c.FinishReason
			}
		}
		if ch.Usage.TotalTokens > 0 {
			u := ch.Usage
			usage = &u
		}
		if chunks >= maxTok/5 && killed == "" {
			n, addr := ws.running(t)
			if n != 1 || workers[addr] == nil {
				t.Fatalf("%d requests running (busiest %q), want 1 on a known worker", n, addr)
			}
			workers[addr].Kill()
			killed = addr
		}
	}
	if err := st.Err(); err != nil {
		t.Fatalf("stream after killing %s: %v", killed, err)
	}
	if killed == "" {
		t.Fatal("the stream ended before a worker could be killed")
	}
	if text.String() != ref.text {
		t.Errorf("migrated stream:\n%q\nuninterrupted:\n%q", text.String(), ref.text)
	}
	if finish != "length" || usage == nil || usage.CompletionTokens != maxTok || usage.PromptTokens != int64(len(prompt)) {
		t.Errorf("migrated stream: finish %q usage %+v, want length with %d+%d", finish, usage, len(prompt), maxTok)
	}
	if v, ok := metric(t, base, "kvmesh_frontend_migrations_total"); !ok || v != 1 {
		t.Errorf("migrations_total %v, want 1", v)
	}

	if err := fe.Stop(syscall.SIGINT, 10*time.Second); err != nil {
		t.Errorf("frontend after SIGINT: %v", err)
	}
	for addr, w := range workers {
		if addr != killed {
			if err := w.Stop(syscall.SIGINT, 10*time.Second); err != nil {
				t.Errorf("worker %s after SIGINT: %v", addr, err)
			}
		}
	}
}
