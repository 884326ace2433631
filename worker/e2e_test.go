package worker_test

import (
	"context"
	"errors"
	"io"
	"reflect"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/eventplane"
	"github.com/kvmesh/kvmesh/index/ref"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/workerclient"
	"github.com/nats-io/nats.go/jetstream"
)

type lockedRef struct {
	mu sync.Mutex
	ix *ref.Index
}

func (l *lockedRef) Apply(e kv.Event)            { l.mu.Lock(); l.ix.Apply(e); l.mu.Unlock() }
func (l *lockedRef) RemoveWorker(w kv.WorkerKey) { l.mu.Lock(); l.ix.RemoveWorker(w); l.mu.Unlock() }
func (l *lockedRef) holdings(w kv.WorkerKey) []ref.Holding {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ix.Holdings(w)
}

// Real `kvmesh worker` processes against an embedded NATS: discovery,
// the event plane into a router-side index (via EventFeed), a NATS restart,
// graceful stop and a crash.
func TestE2EWorkerProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvmesh processes")
	}
	bin := testutil.Binary(t)
	dir := t.TempDir()
	srv, err := natsbus.StartEmbedded(natsbus.EmbeddedConfig{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	port, url := srv.Port(), srv.URL()
	defer func() { srv.Shutdown() }()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc, err := natsbus.Connect(natsbus.ConnConfig{URLs: url, ReconnectWait: 50 * time.Millisecond, MaxReconnectWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const ttl = 2 * time.Second
	d, err := discovery.Open(ctx, nc, discovery.Config{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}

	clients := workerclient.NewPool()
	defer clients.Close()
	ix := &lockedRef{ix: ref.New()}
	feed, err := eventplane.NewFeed(nc, eventplane.FeedConfig{Model: "m", Applier: ix, Repairer: workerclient.Repairer{Clients: clients}, RepairTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	fctx, fcancel := context.WithCancel(ctx)
	feedDone := make(chan error, 1)
	go func() { feedDone <- feed.Run(fctx) }()
	defer func() { fcancel(); <-feedDone }()
	w, err := d.Watch(ctx, "m", feed.OnDiscovery)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	env := []string{"KVMESH_NATS=" + url, "KVMESH_MODEL=m", "KVMESH_BLOCK_SIZE=4", "KVMESH_SPEEDUP_RATIO=0"}
	var procs []*testutil.Proc
	ids := map[uint64]string{}
	var procIDs []uint64
	for range 2 {
		p := testutil.Start(t, "kvmesh worker "+strconv.Itoa(len(procs)), bin, env, "worker", "--blocks", "512", "--load-interval", "100ms", "--log-level", "warn")
		line, err := p.WaitLine("kvmesh worker ready", 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		f := testutil.Fields(line)
		id, err := strconv.ParseUint(f["instance"], 16, 64)
		if err != nil || f["grpc"] == "" {
			t.Fatalf("ready line %q", line)
		}
		ids[id] = f["grpc"]
		procs = append(procs, p)
		procIDs = append(procIDs, id)
	}
	testutil.WaitFor(t, 10*time.Second, "two workers discovered", func() bool { return len(w.Instances()) == 2 })
	for _, in := range w.Instances() {
		if ids[in.ID] != in.GRPCAddr || in.BlockSize != 4 || in.KVCapacity["device"] != 512 {
			t.Fatalf("discovered %+v; processes said %v", in, ids)
		}
	}

	generate := func(in discovery.Instance, base int) {
		t.Helper()
		c, err := clients.Get(in)
		if err != nil {
			t.Fatal(err)
		}
		toks := make([]uint32, 64)
		for i := range toks {
			toks[i] = uint32(base + i)
		}
		st, err := c.Generate(ctx, &api.GenerateRequest{Tokens: toks, MaxTokens: 3})
		if err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := st.Recv(); err == io.EOF {
				return
			} else if err != nil {
				t.Fatal(err)
			}
		}
	}
	// The router-side index equals the worker's own (rebuilt from its dump).
	matches := func(in discovery.Instance) bool {
		c, err := clients.Get(in)
		if err != nil {
			return false
		}
		wk := kv.WorkerKey{Instance: in.ID}
		dr, err := c.Dump(ctx, &api.DumpRequest{Worker: api.KeyToProto(wk)})
		if err != nil {
			return false
		}
		last, ok := feed.LastID(wk)
		if !ok || last != dr.LastId {
			return false
		}
		evs, err := api.EventsFromProto(dr.Events)
		if err != nil {
			t.Fatal(err)
		}
		own := ref.New()
		for _, e := range evs {
			own.Apply(e)
		}
		got := ix.holdings(wk)
		return len(got) > 0 && reflect.DeepEqual(got, own.Holdings(wk))
	}
	ins := w.Instances()
	for i, in := range ins {
		for j := range 5 {
			generate(in, 1000*(i*10+j))
		}
	}
	for _, in := range ins {
		testutil.WaitFor(t, 10*time.Second, "router index equals worker's", func() bool { return matches(in) })
	}

	// NATS restarts on the same port and data dir: nothing is lost.
	srv.Shutdown()
	time.Sleep(300 * time.Millisecond)
	srv, err = natsbus.StartEmbedded(natsbus.EmbeddedConfig{Port: port, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 15*time.Second, "workers back after NATS restart", func() bool { return len(w.Instances()) == 2 })
	for i, in := range ins {
		generate(in, 500000+1000*i)
	}
	for _, in := range ins {
		testutil.WaitFor(t, 15*time.Second, "index equal after NATS restart", func() bool { return matches(in) })
	}

	// SIGTERM deregisters at once; SIGKILL is noticed within the TTL.
	if err := procs[1].Stop(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatalf("graceful stop: %v\n%s", err, procs[1].Stderr())
	}
	// The record is gone the moment the process has exited, whatever the
	// TTL: watching for the removal alone could not tell a deregistration
	// from an expiry.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	bucket, err := js.KeyValue(ctx, discovery.DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bucket.Get(ctx, natsbus.ModelToken("m")+"."+natsbus.InstanceToken(procIDs[1])); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("record of the worker stopped with SIGTERM: %v, want it deleted (found: nil)", err)
	}
	testutil.WaitFor(t, 10*time.Second, "stopped worker removed", func() bool { return len(w.Instances()) == 1 })
	left := w.Instances()[0]
	procs[0].Kill()
	start := time.Now()
	testutil.WaitFor(t, ttl+5*time.Second, "killed worker removed", func() bool { return len(w.Instances()) == 0 })
	t.Logf("killed worker removed after %v (TTL %v)", time.Since(start).Round(10*time.Millisecond), ttl)
	testutil.WaitFor(t, 10*time.Second, "holdings dropped", func() bool { return len(ix.holdings(kv.WorkerKey{Instance: left.ID})) == 0 })
	if s := feed.Stats(); s.BadMessages != 0 {
		t.Fatalf("feed stats %+v", s)
	}
	t.Logf("feed stats: %+v", feed.Stats())
}
