package fleet

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/frontend"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/worker"
	"github.com/kvmesh/kvmesh/workerclient"
)

// tokenByToken is an engine that hands out its inner engine's answer one
// token a chunk, on a channel of a remote adapter's size, gap apart (0: as
// fast as the reader takes them): what an engine streaming a frame per
// token looks like to the worker.
type tokenByToken struct {
	engine.Engine
	gap time.Duration
}

func (e *tokenByToken) Generate(ctx context.Context, req *engine.Request) (<-chan engine.Chunk, error) {
	in, err := e.Engine.Generate(ctx, req)
	if err != nil {
		return nil, err
	}
	out := make(chan engine.Chunk, 16)
	go func() {
		defer close(out)
		send := func(c engine.Chunk) bool {
			if e.gap > 0 {
				time.Sleep(e.gap)
			}
			select {
			case out <- c:
				return true
			case <-ctx.Done():
				return false
			}
		}
		for c := range in {
			for i, t := range c.Tokens {
				one := engine.Chunk{Tokens: []kv.Token{t}}
				if i == len(c.Tokens)-1 {
					one.Finish, one.Usage, one.Err = c.Finish, c.Usage, c.Err
				}
				if !send(one) {
					go func() {
						for range in {
						}
					}()
					return
				}
			}
			if len(c.Tokens) == 0 && !send(c) {
				go func() {
					for range in {
					}
				}()
				return
			}
		}
	}()
	return out, nil
}

// BenchmarkServeRelay streams answers of 128 tokens through serve's whole
// token path, four at a time: Go's HTTP client over loopback → frontend →
// cluster → in-process worker → an engine that sends one token a chunk.
// burst: the engine is never waited on (the relay is behind, tokens queue);
// paced: a token every gap (mostly one at a time, as at an engine's pace).
// cpu-ns/token is the whole process's CPU (getrusage: the client's SSE
// parsing included) per relayed token: what the relay costs the cores an
// engine shares.
//
//	go test ./fleet -run '^$' -bench ServeRelay -benchtime 40x -count 3
func BenchmarkServeRelay(b *testing.B) {
	for _, c := range []struct {
		name string
		gap  time.Duration
	}{{"burst", 0}, {"paced", 500 * time.Microsecond}} {
		b.Run(c.name, func(b *testing.B) { benchRelay(b, c.gap) })
	}
}

func benchRelay(b *testing.B, gap time.Duration) {
	const tokens, streams = 128, 4
	ctx, nc, disc := controlPlane(b, 2*time.Second)
	cfg := sim.DefaultConfig()
	cfg.SpeedupRatio = 0
	inner, err := sim.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	w := startWorker(b, ctx, nc, &tokenByToken{Engine: inner, gap: gap}, worker.Config{})
	model, err := frontend.BuiltinModel(cfg.Model)
	if err != nil {
		b.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cl, err := New(ctx, Config{NC: nc, Discovery: disc, Models: []string{model.Name}, Local: []workerclient.Local{w.Local()},
		Router: router.Config{Mode: router.ModeKV}, Registerer: reg, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cl.Close)
	waitFor(b, 10*time.Second, "the cluster sees the worker", func() bool { return len(cl.router.Workers(cfg.Model, kv.RoleAggregated)) == 1 })
	ts := httptest.NewServer(frontend.New(frontend.DefaultConfig(), cl, servedModels(model), reg, reg))
	b.Cleanup(ts.Close)
	hc := ts.Client()
	hc.Transport.(*http.Transport).MaxIdleConnsPerHost = streams
	one := func(i int64) error {
		body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":%d,"ignore_eos":true,"messages":[{"role":"user","content":"relay %d: tell me something about latency"}]}`,
			model.Name, tokens, i)
		resp, err := hc.Post(ts.URL+"/v1/chat/completions", "application/json", bytes.NewReader([]byte(body)))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		sc := bufio.NewScanner(resp.Body)
		events := 0
		for sc.Scan() {
			if bytes.HasPrefix(sc.Bytes(), []byte("data: {")) {
				events++
			}
		}
		if events < 2 {
			return fmt.Errorf("%d events", events)
		}
		return sc.Err()
	}
	if err := one(-1); err != nil { // warm: connections, the model's caches
		b.Fatal(err)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	cpu0 := processCPU()
	b.ResetTimer()
	for range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := one(i); err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	cpu := processCPU() - cpu0
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	n := float64(b.N * tokens)
	b.ReportMetric(float64(cpu.Nanoseconds())/n, "cpu-ns/token")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/token")
}
