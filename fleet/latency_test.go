package fleet

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	goruntime "runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/frontend"
	"github.com/kvmesh/kvmesh/internal/quantile"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus/natstest"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/worker"
	"github.com/kvmesh/kvmesh/workerclient"
)

// TestFrontendAddedLatency measures what the OpenAI frontend and the router
// add on top of a worker's gRPC stream. The same kind of streams run, in one
// process and one run, directly against the workers' gRPC API and through
// the HTTP frontend (Cluster backend: router + gRPC). Every engine is
// wrapped so the time each token leaves the engine is recorded; the
// client's receive time minus that is the token's delivery latency, so the
// engine's own pacing cancels out. It prints p50/p99 of delivery latency,
// TTFT and inter-token latency for both paths and their difference.
// Everything shares the machine's cores, so the result depends on them:
// docs/benchmarks.md §3 has the figures at 2 to 16 cores (GOMAXPROCS).
//
//	KVMESH_BENCH=1 go test ./fleet -run TestFrontendAddedLatency -v
//
// Knobs (env): KVMESH_BENCH_STREAMS (200), KVMESH_BENCH_TOKENS (64),
// KVMESH_BENCH_WORKERS (4), KVMESH_BENCH_SPEEDUP (2: sim time divisor),
// KVMESH_BENCH_CPUPROFILE (file: CPU profile of the frontend phase),
// KVMESH_BENCH_MEMPROFILE (file: allocations of the frontend phase),
// KVMESH_BENCH_H2C (1: the HTTP client speaks cleartext HTTP/2).
func TestFrontendAddedLatency(t *testing.T) {
	if os.Getenv("KVMESH_BENCH") == "" {
		t.Skip("set KVMESH_BENCH=1 to run the latency benchmark")
	}
	if os.Getenv("KVMESH_BENCH_MEMPROFILE") != "" {
		goruntime.MemProfileRate = 512
	}
	streams := envInt("KVMESH_BENCH_STREAMS", 200)
	tokens := envInt("KVMESH_BENCH_TOKENS", 64)
	nworkers := envInt("KVMESH_BENCH_WORKERS", 4)
	speedup := 2.0
	if v, err := strconv.ParseFloat(os.Getenv("KVMESH_BENCH_SPEEDUP"), 64); err == nil {
		speedup = v
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	nc := natstest.Connect(t, natstest.Start(t).URL())
	disc, err := discovery.Open(ctx, nc, discovery.Config{})
	if err != nil {
		t.Fatal(err)
	}

	rec := &emitLog{byID: map[string]*emitted{}}
	var clients []api.WorkerClient
	wclients := workerclient.NewPool()
	defer wclients.Close()
	for wi := range nworkers {
		cfg := sim.DefaultConfig()
		cfg.SpeedupRatio = speedup
		eng, err := sim.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		w, err := worker.New(worker.Config{Logger: log}, &stampEngine{Engine: eng, log: rec, worker: wi}, nc)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		c, err := wclients.Get(w.Instance())
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}

	model, err := frontend.BuiltinModel("kvmesh-sim")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cl, err := New(ctx, Config{NC: nc, Discovery: disc, Models: []string{model.Name},
		Registerer: reg, Logger: log, Router: router.Config{Mode: router.ModeKV}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for cl.Ready() != nil || len(cl.router.Workers("kvmesh-sim", kv.RoleAggregated)) < nworkers {
		time.Sleep(10 * time.Millisecond)
	}
	cfg := frontend.DefaultConfig()
	srv := &http.Server{Handler: frontend.New(cfg, cl, servedModels(model), reg, reg)}
	// KVMESH_BENCH_H2C=1: the client speaks cleartext HTTP/2, so all streams
	// share one connection and the server may coalesce their frames.
	h2c := os.Getenv("KVMESH_BENCH_H2C") != ""
	if h2c {
		var protos http.Protocols
		protos.SetHTTP1(true)
		protos.SetUnencryptedHTTP2(true)
		srv.Protocols = &protos
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	url := "http://" + ln.Addr().String() + "/v1/chat/completions"
	tr := &http.Transport{MaxIdleConnsPerHost: streams * 2}
	if h2c {
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		tr.Protocols = &p
	}
	hc := &http.Client{Transport: tr}
	defer hc.CloseIdleConnections()

	prompt := func(phase string, i int) []frontend.Message {
		return []frontend.Message{{Role: "user", Content: fmt.Sprintf("%s stream %d: tell me something about latency", phase, i)}}
	}
	runDirect := func(phase string) *pathStats {
		ps := &pathStats{cpu0: cpuTime(), wall0: time.Now(), sys0: readSyscalls()}
		defer ps.done()
		var wg sync.WaitGroup
		for i := range streams {
			ids, err := model.EncodeChat(prompt(phase, i))
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() {
				id := fmt.Sprintf("%s-%d", phase, i)
				start := time.Now()
				st, err := clients[i%len(clients)].Generate(ctx, &api.GenerateRequest{RequestId: id, Tokens: ids,
					MaxTokens: uint32(tokens), StopTokenIds: model.EOS, Seed: uint64(i), Temperature: 1})
				if err != nil {
					ps.fail(err)
					return
				}
				var recv []time.Time
				for {
					ch, err := st.Recv()
					if err == io.EOF {
						break
					}
					if err != nil {
						ps.fail(err)
						return
					}
					now := time.Now()
					for range ch.Tokens {
						recv = append(recv, now)
					}
				}
				em := rec.get(id)
				if em == nil || len(em.at) != len(recv) {
					ps.fail(fmt.Errorf("%s: %d tokens received, engine log %v", id, len(recv), em))
					return
				}
				ps.add(id, start, em.accepted, recv, em.at)
			})
		}
		wg.Wait()
		return ps
	}
	runFrontend := func(phase string) *pathStats {
		ps := &pathStats{cpu0: cpuTime(), wall0: time.Now(), sys0: readSyscalls()}
		defer ps.done()
		var wg sync.WaitGroup
		for i := range streams {
			body, _ := json.Marshal(map[string]any{"model": "kvmesh-sim", "messages": []map[string]string{{"role": "user", "content": prompt(phase, i)[0].Content}},
				"max_tokens": tokens, "seed": i, "stream": true})
			wg.Go(func() {
				start := time.Now()
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := hc.Do(req)
				if err != nil {
					ps.fail(err)
					return
				}
				defer resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b, _ := io.ReadAll(resp.Body)
					ps.fail(fmt.Errorf("status %d: %s", resp.StatusCode, b))
					return
				}
				id, recv, err := readSSE(resp.Body)
				if err != nil {
					ps.fail(err)
					return
				}
				em := rec.get(id)
				if em == nil {
					ps.fail(fmt.Errorf("no engine log for %s", id))
					return
				}
				// Map chunks to the tokens that completed text: a token
				// whose bytes end mid-character yields no chunk of its own.
				at := textTokens(model, em)
				if len(at) != len(recv) {
					ps.fail(fmt.Errorf("%s: %d content chunks for %d text-completing tokens", id, len(recv), len(at)))
					return
				}
				ps.add(id, start, em.accepted, recv, at)
			})
		}
		wg.Wait()
		return ps
	}

	// Warm both paths (connections, caches of the Go runtime), then measure.
	runDirect("warm-d")
	runFrontend("warm-f")
	// Both measured phases start from a collected heap, so the warm-up's
	// garbage is not collected in the middle of one of them.
	goruntime.GC()
	direct := runDirect("direct")
	goruntime.GC()
	var prof *os.File
	if p := os.Getenv("KVMESH_BENCH_CPUPROFILE"); p != "" {
		if prof, err = os.Create(p); err != nil {
			t.Fatal(err)
		}
		if err := pprof.StartCPUProfile(prof); err != nil {
			t.Fatal(err)
		}
	}
	// KVMESH_BENCH_MEMPROFILE=file: allocation profiles before (file.base)
	// and after the frontend phase; compare with pprof -diff_base.
	memProf := os.Getenv("KVMESH_BENCH_MEMPROFILE")
	writeAllocs := func(name string) {
		goruntime.GC() // publishes the allocations so far
		f, err := os.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
			t.Fatal(err)
		}
	}
	if memProf != "" {
		writeAllocs(memProf + ".base")
	}
	fe := runFrontend("frontend")
	if memProf != "" {
		writeAllocs(memProf)
	}
	if prof != nil {
		pprof.StopCPUProfile()
		prof.Close()
	}
	for _, ps := range []*pathStats{direct, fe} {
		if ps.err != nil {
			t.Fatalf("%d streams failed; first: %v", ps.failed, ps.err)
		}
	}

	fmt.Printf("\nfrontend added latency: %d concurrent streams × %d tokens, %d sim workers (speedup %g), GOMAXPROCS %d\n",
		streams, tokens, nworkers, speedup, goruntime.GOMAXPROCS(0))
	fmt.Printf("%-24s %12s %12s %12s %12s\n", "", "direct p50", "direct p99", "front p50", "front p99")
	row := func(name string, d, f []time.Duration) {
		fmt.Printf("%-24s %12v %12v %12v %12v   Δp50 %v  Δp99 %v\n", name, pct(d, 50), pct(d, 99), pct(f, 50), pct(f, 99),
			pct(f, 50)-pct(d, 50), pct(f, 99)-pct(d, 99))
	}
	row("delivery (emit→client)", direct.delivery, fe.delivery)
	row("request→engine", direct.accept, fe.accept)
	row("TTFT (client)", direct.ttft, fe.ttft)
	row("inter-token (client)", direct.itl, fe.itl)
	fmt.Printf("samples: direct %d tokens, frontend %d text chunks\n", len(direct.delivery), len(fe.delivery))
	fmt.Printf("process CPU per token (server + client + workers): direct %v, frontend %v; phase wall: direct %v, frontend %v\n",
		direct.cpu/time.Duration(len(direct.delivery)), fe.cpu/time.Duration(len(fe.delivery)), direct.wall.Round(time.Millisecond), fe.wall.Round(time.Millisecond))
	fmt.Printf("requests per worker: direct %v, frontend %v (router mode kv)\n", rec.perWorker(direct.ids, nworkers), rec.perWorker(fe.ids, nworkers))
	perTok := func(n int64, ps *pathStats) float64 { return float64(n) / float64(len(ps.delivery)) }
	fmt.Printf("system calls per token (read/write): direct %.2f/%.2f, frontend %.2f/%.2f\n",
		perTok(direct.sysr, direct), perTok(direct.sysw, direct), perTok(fe.sysr, fe), perTok(fe.sysw, fe))
}

// readSSE reads an OpenAI chat stream: the completion id and the receive
// time of every chunk that carries content.
func readSSE(r io.Reader) (string, []time.Time, error) {
	sc := bufio.NewScanner(r)
	// Small to start (it grows as needed): a 64 KiB buffer per stream was
	// 13 MB per phase of client garbage, and the GC it set off during the
	// frontend phase showed up as frontend latency.
	sc.Buffer(make([]byte, 0, 4<<10), 1<<20)
	var id string
	var recv []time.Time
	for sc.Scan() {
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data: "))
		if !ok {
			continue
		}
		now := time.Now()
		if bytes.Equal(data, []byte("[DONE]")) {
			return id, recv, nil
		}
		// Parse lightly: the client's cost is not the server's latency.
		if bytes.Contains(data, []byte(`"error":`)) {
			return id, recv, fmt.Errorf("in-stream error %s", data)
		}
		if id == "" {
			var ch struct {
				ID string `json:"id"`
			}
			if err := json.Unmarshal(data, &ch); err != nil {
				return id, recv, fmt.Errorf("chunk %q: %w", data, err)
			}
			id = ch.ID
		}
		if i := bytes.Index(data, []byte(`"content":"`)); i >= 0 && data[i+len(`"content":"`)] != '"' {
			recv = append(recv, now)
		}
	}
	if err := sc.Err(); err != nil {
		return id, recv, err
	}
	return id, recv, fmt.Errorf("stream ended without [DONE]")
}

// textTokens returns the emit times of the tokens after which the
// frontend's detokenizer releases text (EOS ids never show).
func textTokens(m *frontend.Model, em *emitted) []time.Time {
	d := m.NewDetokenizer()
	var out []time.Time
	for i, id := range em.ids {
		if slices.Contains(m.EOS, id) {
			continue
		}
		if d.Add(id) != "" {
			out = append(out, em.at[i])
		}
	}
	if d.Flush() != "" && len(em.at) > 0 {
		out = append(out, em.at[len(em.at)-1]) // the end-of-stream flush
	}
	return out
}

// stampEngine records when each token leaves the engine.
type stampEngine struct {
	engine.Engine
	log    *emitLog
	worker int
}

func (s *stampEngine) Generate(ctx context.Context, req *engine.Request) (<-chan engine.Chunk, error) {
	accepted := time.Now()
	in, err := s.Engine.Generate(ctx, req)
	if err != nil {
		return nil, err
	}
	em := s.log.start(req.ID, s.worker, accepted)
	out := make(chan engine.Chunk, 1)
	go func() {
		defer close(out)
		for ch := range in {
			em.mu.Lock()
			now := time.Now()
			for _, id := range ch.Tokens {
				em.ids = append(em.ids, id)
				em.at = append(em.at, now)
			}
			em.mu.Unlock()
			select {
			case out <- ch:
			case <-ctx.Done():
				// The worker stopped reading; let the engine's channel drain.
				for range in {
				}
				return
			}
		}
	}()
	return out, nil
}

type emitted struct {
	mu       sync.Mutex
	worker   int
	accepted time.Time // the engine got the request
	ids      []uint32
	at       []time.Time
}

type emitLog struct {
	mu   sync.Mutex
	byID map[string]*emitted
}

func (l *emitLog) start(id string, worker int, accepted time.Time) *emitted {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := &emitted{worker: worker, accepted: accepted}
	l.byID[id] = e
	return e
}

// perWorker counts the requests each worker got among ids.
func (l *emitLog) perWorker(ids []string, n int) []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]int, n)
	for _, id := range ids {
		if e := l.byID[id]; e != nil {
			out[e.worker]++
		}
	}
	return out
}

func (l *emitLog) get(id string) *emitted {
	l.mu.Lock()
	e := l.byID[id]
	l.mu.Unlock()
	if e == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return &emitted{worker: e.worker, accepted: e.accepted, ids: slices.Clone(e.ids), at: slices.Clone(e.at)}
}

type pathStats struct {
	mu                  sync.Mutex
	delivery, ttft, itl []time.Duration
	accept              []time.Duration // client start → engine has the request
	failed              int
	err                 error
	cpu0                time.Duration
	wall0               time.Time
	cpu, wall           time.Duration
	sys0                [2]int64
	sysr, sysw          int64
	ids                 []string
}

func (p *pathStats) done() {
	p.cpu, p.wall = cpuTime()-p.cpu0, time.Since(p.wall0)
	s := readSyscalls()
	p.sysr, p.sysw = s[0]-p.sys0[0], s[1]-p.sys0[1]
}

// readSyscalls returns the process's read and write system calls so far
// (Linux /proc/self/io; zeros elsewhere).
func readSyscalls() [2]int64 {
	var out [2]int64
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return out
	}
	for _, l := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(l, []byte("syscr: ")); ok {
			out[0], _ = strconv.ParseInt(string(v), 10, 64)
		}
		if v, ok := bytes.CutPrefix(l, []byte("syscw: ")); ok {
			out[1], _ = strconv.ParseInt(string(v), 10, 64)
		}
	}
	return out
}

// cpuTime is the process's user + system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (p *pathStats) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failed++
	if p.err == nil {
		p.err = err
	}
}

func (p *pathStats) add(id string, start, accepted time.Time, recv, emit []time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ids = append(p.ids, id)
	p.accept = append(p.accept, accepted.Sub(start))
	for i := range recv {
		p.delivery = append(p.delivery, recv[i].Sub(emit[i]))
		if i == 0 {
			p.ttft = append(p.ttft, recv[0].Sub(start))
		} else {
			p.itl = append(p.itl, recv[i].Sub(recv[i-1]))
		}
	}
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return quantile.Nearest(s, float64(p)/100).Round(time.Microsecond)
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
