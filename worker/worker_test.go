package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/api/apitest"
	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/eventplane"
	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/index/ref"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/workerclient"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testutil.WithBinary(m), goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*ats).start"))
}

// testEngine stores each prompt's full blocks (one Stored event per
// request, engine hash = sequence hash) and streams MaxTokens tokens, one
// per tick, until cancelled.
type testEngine struct {
	tick      time.Duration
	mu        sync.Mutex
	sink      engine.EventSink
	cancelled atomic.Int64
	running   atomic.Int64
	wg        sync.WaitGroup
	closed    atomic.Bool
	// hang makes every stream stop emitting (the engine hangs but stays
	// alive); streams still end when cancelled.
	hang atomic.Bool
	// chunk is the tokens per chunk of streams started from now (0: 1).
	chunk atomic.Int64
	// admit, when set before the first call, holds every Generate call
	// until it is closed, whatever the caller's context says (an engine
	// stuck on admission).
	admit chan struct{}
	// lastOut is when a stream last offered the worker a chunk (UnixNano).
	lastOut atomic.Int64
}

func (e *testEngine) Config() engine.Config {
	return engine.Config{Model: "m", Role: kv.RoleAggregated, BlockSize: 4, Blocks: 100, MaxBatchedTokens: 64, Digest: "test"}
}

func (e *testEngine) SetEventSink(s engine.EventSink) { e.mu.Lock(); e.sink = s; e.mu.Unlock() }

func (e *testEngine) Stats() engine.Stats {
	return engine.Stats{Running: int(e.running.Load()), TotalBlocks: 100}
}

func (e *testEngine) Close() error { e.closed.Store(true); e.wg.Wait(); return nil }

func (e *testEngine) Generate(ctx context.Context, req *engine.Request) (<-chan engine.Chunk, error) {
	if e.admit != nil {
		<-e.admit
	}
	if e.closed.Load() {
		return nil, engine.ErrClosed
	}
	local, seq := kv.NewHasher(4, req.LoRA, req.CacheSalt).Blocks(req.Tokens)
	if len(local) > 0 {
		blocks := make([]kv.StoredBlock, len(local))
		for i := range local {
			blocks[i] = kv.StoredBlock{EngineHash: kv.EngineHash(seq[i]), LocalHash: local[i]}
		}
		e.mu.Lock()
		if e.sink != nil {
			e.sink([]kv.Event{kv.Stored(kv.WorkerKey{}, kv.TierDevice, nil, blocks)})
		}
		e.mu.Unlock()
	}
	out := make(chan engine.Chunk)
	e.running.Add(1)
	e.wg.Go(func() {
		defer close(out)
		defer e.running.Add(-1)
		t := time.NewTicker(e.tick)
		defer t.Stop()
		per := max(int(e.chunk.Load()), 1)
		for i := range req.MaxTokens {
			c := engine.Chunk{Tokens: []kv.Token{kv.Token(1000 + i)}}
			if per > 1 {
				c.Tokens = make([]kv.Token, per)
			}
			if i == req.MaxTokens-1 {
				c.Finish = kv.FinishLength
				c.Usage = &engine.Usage{PromptTokens: len(req.Tokens), CompletionTokens: req.MaxTokens}
			}
			select {
			case <-ctx.Done():
				e.cancelled.Add(1)
				return
			case <-t.C:
			}
			if e.hang.Load() {
				<-ctx.Done()
				e.cancelled.Add(1)
				return
			}
			// Stamped before the send: the worker cannot count the chunk
			// earlier than this.
			e.lastOut.Store(time.Now().UnixNano())
			select {
			case out <- c:
			case <-ctx.Done():
				e.cancelled.Add(1)
				return
			}
		}
	})
	return out, nil
}

func startNATS(t *testing.T) (*natsbus.Embedded, *nats.Conn) {
	t.Helper()
	e, err := natsbus.StartEmbedded(natsbus.EmbeddedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Shutdown)
	nc, err := natsbus.Connect(natsbus.ConnConfig{URLs: e.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return e, nc
}

func startWorker(t *testing.T, nc *nats.Conn, eng engine.Engine) (*Worker, api.WorkerClient) {
	t.Helper()
	return startWorkerWith(t, nc, eng, Config{})
}

// startWorkerWith is startWorker with cfg's other fields set.
func startWorkerWith(t *testing.T, nc *nats.Conn, eng engine.Engine, cfg Config) (*Worker, api.WorkerClient) {
	t.Helper()
	cfg.Discovery = discovery.Config{TTL: 2 * time.Second, Memory: true}
	cfg.LoadInterval = 50 * time.Millisecond
	w, err := New(cfg, eng, nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	clients := workerclient.NewPool()
	t.Cleanup(clients.Close)
	c, err := clients.Get(w.Instance())
	if err != nil {
		t.Fatal(err)
	}
	return w, c
}

func prompt(base, n int) []uint32 {
	p := make([]uint32, n)
	for i := range p {
		p[i] = uint32(base + i)
	}
	return p
}

func TestGenerateAndCancel(t *testing.T) {
	_, nc := startNATS(t)
	eng := &testEngine{tick: time.Millisecond}
	_, c := startWorker(t, nc, eng)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	st, err := c.Generate(ctx, &api.GenerateRequest{RequestId: "r1", Tokens: prompt(1, 10), MaxTokens: 5})
	if err != nil {
		t.Fatal(err)
	}
	toks, last := apitest.Drain(t, st)
	if !reflect.DeepEqual(toks, []uint32{1000, 1001, 1002, 1003, 1004}) || last.FinishReason != "length" ||
		last.Usage.GetPromptTokens() != 10 || last.Usage.GetCompletionTokens() != 5 {
		t.Fatalf("tokens %v, last chunk %v", toks, last)
	}

	// Cancelling the call stops the engine's work.
	eng.tick = 20 * time.Millisecond
	cctx, ccancel := context.WithCancel(ctx)
	st, err = c.Generate(cctx, &api.GenerateRequest{RequestId: "r2", Tokens: prompt(1, 10), MaxTokens: 100000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	ccancel()
	testutil.WaitFor(t, 5*time.Second, "the engine to be cancelled", func() bool { return eng.cancelled.Load() == 1 && eng.running.Load() == 0 },
		func() string { return fmt.Sprintf("cancelled %d running %d", eng.cancelled.Load(), eng.running.Load()) })

	// Bad requests are refused with precise codes.
	for _, req := range []*api.GenerateRequest{{MaxTokens: 1}, {Tokens: []uint32{1}}, {Tokens: []uint32{1}, MaxTokens: 1, DpRank: 3}} {
		st, err := c.Generate(ctx, req)
		if err == nil {
			_, err = st.Recv()
		}
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("request %v: %v, want InvalidArgument", req, err)
		}
	}
	h, err := c.Health(ctx, &api.HealthRequest{})
	if err != nil || !h.Ok || h.Model != "m" {
		t.Fatalf("health %v %v", h, err)
	}
}

func TestEventsPlaneAndRepairAnswers(t *testing.T) {
	_, nc := startNATS(t)
	eng := &testEngine{tick: time.Microsecond}
	w, c := startWorker(t, nc, eng)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	msgs := make(chan *nats.Msg, 100)
	sub, err := nc.ChanSubscribe(w.EventSubject(), msgs)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	nc.Flush()

	const n = 20
	for i := range n {
		st, err := c.Generate(ctx, &api.GenerateRequest{Tokens: prompt(i*100, 8+i%3*4), MaxTokens: 1})
		if err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := st.Recv(); err != nil {
				if err != io.EOF {
					t.Fatal(err)
				}
				break
			}
		}
	}
	// Every event arrives on NATS, ids 1..n in order, stamped with the
	// instance id.
	wk := kv.WorkerKey{Instance: w.InstanceID()}
	seen := ref.New()
	for want := uint64(1); want <= n; {
		select {
		case m := <-msgs:
			var b api.KvEventBatch
			if err := proto.Unmarshal(m.Data, &b); err != nil {
				t.Fatal(err)
			}
			evs, err := api.EventsFromProto(b.Events)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range evs {
				if e.ID != want || e.Worker != wk {
					t.Fatalf("event id %d worker %v, want %d %v", e.ID, e.Worker, want, wk)
				}
				seen.Apply(e)
				want++
			}
		case <-ctx.Done():
			t.Fatal("events did not arrive")
		}
	}

	r, err := c.Events(ctx, &api.EventsRequest{Worker: api.KeyToProto(wk), FromId: 3, ToId: 7})
	if err != nil || len(r.Events) != 5 || r.Events[0].Id != 3 || r.TooOld || r.LastId != n {
		t.Fatalf("events answer %v %v", r, err)
	}
	if r, err := c.Events(ctx, &api.EventsRequest{Worker: api.KeyToProto(wk), FromId: n, ToId: n + 5}); err != nil || !r.TooNew || len(r.Events) != 1 {
		t.Fatalf("events past the end %v %v", r, err)
	}
	if _, err := c.Events(ctx, &api.EventsRequest{Worker: &api.WorkerKey{Instance: 1}, FromId: 1, ToId: 1}); status.Code(err) != codes.NotFound {
		t.Fatalf("events of another instance: %v", err)
	}
	// testEngine lists no inventory: the dump says so, holds nothing and
	// names the last event id, so a router applying it clears the worker
	// and resumes from there.
	d, err := c.Dump(ctx, &api.DumpRequest{Worker: api.KeyToProto(wk)})
	if err != nil || d.LastId != n || !d.NoInventory || len(d.Events) != 0 {
		t.Fatalf("dump %v %v", d, err)
	}
	if seen.Holdings(wk) == nil {
		t.Fatal("the events stored nothing")
	}
}

// A worker over the sim answers dumps from the sim's inventory: after a load
// that evicts, the dump is exactly what the sim holds (every prompt's
// cached prefix, as the sim's own lookup finds it) and what its events
// built, up to the dump's last event id.
func TestDumpIsTheSimsInventory(t *testing.T) {
	eng := smallSim(t)
	w, c := startWorker(t, nil, eng)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var prompts [][]uint32
	for i := range 30 {
		p := append(prompt(7, 4*(1+i%5)), prompt(1000*(i+1), 4*(i%4)+2)...)
		prompts = append(prompts, p)
		st, err := c.Generate(ctx, &api.GenerateRequest{Tokens: p, MaxTokens: 3})
		if err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := st.Recv(); err != nil {
				if err != io.EOF {
					t.Fatal(err)
				}
				break
			}
		}
	}
	if eng.Counters().EvictedBlocks == 0 {
		t.Fatal("the load evicted nothing")
	}
	wk := kv.WorkerKey{Instance: w.InstanceID()}
	d, err := c.Dump(ctx, &api.DumpRequest{Worker: api.KeyToProto(wk)})
	if err != nil || d.NoInventory || d.LastId != w.EventLog().LastID(0) {
		t.Fatalf("dump %v %v", d, err)
	}
	dumped, err := api.EventsFromProto(d.Events)
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Events(ctx, &api.EventsRequest{Worker: api.KeyToProto(wk), FromId: 1, ToId: d.LastId})
	if err != nil || r.TooOld || len(r.Events) != int(d.LastId) {
		t.Fatalf("events %v %v", r, err)
	}
	streamed, err := api.EventsFromProto(r.Events)
	if err != nil {
		t.Fatal(err)
	}
	fromDump, fromEvents := ref.New(), ref.New()
	ix := index.New()
	for _, e := range dumped {
		if e.Worker != wk || e.ID != 0 {
			t.Fatalf("dump event of %v, id %d", e.Worker, e.ID)
		}
		fromDump.Apply(e)
		ix.Apply(e)
	}
	for _, e := range streamed {
		fromEvents.Apply(e)
	}
	if got, want := fromDump.Holdings(wk), fromEvents.Holdings(wk); !reflect.DeepEqual(got, want) || len(want) == 0 {
		t.Fatalf("dump rebuilds %d holdings, the events %d", len(got), len(want))
	}
	for i, p := range prompts {
		local, seq := kv.NewHasher(4, "", "").Blocks(p)
		var depth uint32
		for _, m := range ix.FindMatches(local, nil) {
			depth = m.Depth[kv.TierDevice]
		}
		if int(depth) != eng.Lookup(seq) {
			t.Fatalf("prompt %d: the dump holds %d blocks of it, the sim %d", i, depth, eng.Lookup(seq))
		}
	}
}

func TestDiscoveryAndLoad(t *testing.T) {
	_, nc := startNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d := memDiscovery(t, ctx, nc)
	var mu sync.Mutex
	var evs []discovery.Event
	wt, err := d.Watch(ctx, "m", func(ev discovery.Event) { mu.Lock(); evs = append(evs, ev); mu.Unlock() })
	if err != nil {
		t.Fatal(err)
	}
	defer wt.Close()
	loads := subscribeLoads(t, nc, 16)

	w, err := New(Config{Discovery: discovery.Config{TTL: 2 * time.Second, Memory: true}, LoadInterval: 20 * time.Millisecond}, &testEngine{tick: time.Millisecond}, nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "worker discovered", func() bool {
		ins := wt.Instances()
		return len(ins) == 1 && ins[0].ID == w.InstanceID() && ins[0].GRPCAddr == w.Addr() && ins[0].BlockSize == 4
	})
	select {
	case r := <-loads:
		if r.Instance != w.InstanceID() || r.TotalBlocks != 100 {
			t.Fatalf("load report %+v", r)
		}
	case <-ctx.Done():
		t.Fatal("no load report")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "worker removed on close", func() bool { return len(wt.Instances()) == 0 })
	// The watcher drops an instance from its map before it calls back
	// with the removal: wait for the callback too.
	testutil.WaitFor(t, 10*time.Second, "removal delivered", func() bool { mu.Lock(); defer mu.Unlock(); return len(evs) >= 2 })
	mu.Lock()
	defer mu.Unlock()
	if len(evs) != 2 || evs[0].Kind != discovery.InstanceAdded || evs[1].Kind != discovery.InstanceRemoved {
		t.Fatalf("discovery events %+v", evs)
	}
}

// The real simulated engine behind the worker API.
func TestWorkerWithSim(t *testing.T) {
	_, nc := startNATS(t)
	cfg := sim.DefaultConfig()
	cfg.Model, cfg.BlockSize, cfg.Blocks, cfg.SpeedupRatio = "m", 4, 256, 0
	eng, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w, c := startWorker(t, nc, eng)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var usage *api.Usage
	for range 2 {
		st, err := c.Generate(ctx, &api.GenerateRequest{Tokens: prompt(7, 33), MaxTokens: 4})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			ch, err := st.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			n += len(ch.Tokens)
			if ch.Usage != nil {
				usage = ch.Usage
			}
		}
		if n != 4 {
			t.Fatalf("%d tokens, want 4", n)
		}
	}
	if usage.GetCachedTokens() == 0 {
		t.Fatalf("second identical prompt had no cache hit: %v", usage)
	}
	if w.EventLog().LastID(0) == 0 {
		t.Fatal("sim produced no KV events")
	}
}

// memDiscovery opens an in-memory discovery store with a 2 s TTL.
func memDiscovery(t *testing.T, ctx context.Context, nc *nats.Conn) *discovery.Discovery {
	t.Helper()
	d, err := discovery.Open(ctx, nc, discovery.Config{TTL: 2 * time.Second, Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// subscribeLoads collects model "m"'s load reports (up to n unread; later
// ones are dropped) until the test ends.
func subscribeLoads(t *testing.T, nc *nats.Conn, n int) <-chan eventplane.LoadReport {
	t.Helper()
	loads := make(chan eventplane.LoadReport, n)
	sub, err := eventplane.SubscribeLoad(nc, "m", func(r eventplane.LoadReport) {
		select {
		case loads <- r:
		default:
		}
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	return loads
}

// TestCloseWithNATSAway: a worker shut down while NATS is unreachable
// cannot delete its discovery record; that is no failure of the shutdown
// (the record expires with its TTL), so Close answers nil.
func TestCloseWithNATSAway(t *testing.T) {
	e, nc := startNATS(t)
	eng := smallSim(t)
	w, _ := startWorker(t, nc, eng)
	e.Shutdown()
	testutil.WaitFor(t, 10*time.Second, "the connection to notice NATS is gone", func() bool { return !nc.IsConnected() })
	if err := w.Close(); err != nil {
		t.Fatalf("Close with NATS away: %v", err)
	}
}

// sinkSource is an event source beside the engine (as the KVCR agent is).
type sinkSource struct{ sink engine.EventSink }

func (s *sinkSource) SetEventSink(sink engine.EventSink) { s.sink = sink }

// Another event source's blocks are not in the engine's inventory, though
// they take the same event ids: a dump would mark them reflected and drop
// them for good, so the worker gives none.
func TestNoDumpBesideAnotherEventSource(t *testing.T) {
	eng := smallSim(t)
	src := &sinkSource{}
	w, c := startWorkerWith(t, nil, eng, Config{EventSources: []EventSource{src}})
	if src.sink == nil {
		t.Fatal("the source got no sink")
	}
	src.sink([]kv.Event{kv.Stored(kv.WorkerKey{}, kv.TierHost, nil, []kv.StoredBlock{{EngineHash: 5}})})
	wk := kv.WorkerKey{Instance: w.InstanceID()}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := c.Dump(ctx, &api.DumpRequest{Worker: api.KeyToProto(wk)})
	if err != nil || !d.NoInventory || d.LastId != 1 {
		t.Fatalf("dump %v %v", d, err)
	}
}

// smallSim is a sim of 48 blocks of 4 tokens that answers at once.
func smallSim(t *testing.T) *sim.Engine {
	t.Helper()
	cfg := sim.DefaultConfig()
	cfg.Model, cfg.BlockSize, cfg.Blocks, cfg.SpeedupRatio = "m", 4, 48, 0
	eng, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return eng
}
