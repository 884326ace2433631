package eventplane

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/index/ref"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/natsbus/natstest"
	"github.com/kvmesh/kvmesh/workerclient"
)

func TestMain(m *testing.M) { natstest.Main(m) }

// lockedIndex is the router-side applier under test: the reference index.
type lockedIndex struct {
	mu sync.Mutex
	ix *ref.Index
}

func (l *lockedIndex) Apply(e kv.Event) { l.mu.Lock(); l.ix.Apply(e); l.mu.Unlock() }
func (l *lockedIndex) RemoveWorker(w kv.WorkerKey) {
	l.mu.Lock()
	l.ix.RemoveWorker(w)
	l.mu.Unlock()
}
func (l *lockedIndex) holdings(w kv.WorkerKey) []ref.Holding {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ix.Holdings(w)
}

// teeIndex is a fake worker's cache for tests: the real index answers
// dumps (the EventLog's Holdings), the reference model lists holdings for
// comparison. Like an engine, it holds its lock while its events reach the
// log, and while it lists its holdings.
type teeIndex struct {
	mu  sync.Mutex
	ix  *index.Index
	ref *ref.Index
}

func newTee() *teeIndex { return &teeIndex{ix: index.New(), ref: ref.New()} }

// emit applies a batch and hands it to sink (the log), under the lock.
func (t *teeIndex) emit(batch []kv.Event, sink func([]kv.Event)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, e := range batch {
		t.ix.Apply(e)
		t.ref.Apply(e)
	}
	sink(batch)
}

// Holdings implements Holdings.
func (t *teeIndex) Holdings(w kv.WorkerKey, mark func()) ([]kv.Event, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	mark()
	return t.ix.Dump(w), true
}

func (t *teeIndex) refHoldings(w kv.WorkerKey) []ref.Holding {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ref.Holdings(w)
}

// fakeWorker serves Events/Dump from an EventLog over real gRPC and can be
// told to fail its next calls.
type fakeWorker struct {
	api.UnimplementedWorkerServer
	log      *EventLog
	local    *teeIndex
	pub      *Publisher
	fail     atomic.Int32
	calls    atomic.Int32
	addr     string
	srv      *grpc.Server
	rng      *rand.Rand
	nextHash uint64
	chains   [][]kv.EngineHash // of rank
	// rank is the DP rank step changes (see useRank); dp is the
	// instance's DP size (0: 1).
	rank   uint32
	dp     int
	others map[uint32][][]kv.EngineHash // chains of the other ranks
}

// useRank makes step change rank r's cache from now on.
func (f *fakeWorker) useRank(r uint32) {
	if f.others == nil {
		f.others = map[uint32][][]kv.EngineHash{}
	}
	f.others[f.rank] = f.chains
	f.rank, f.chains = r, f.others[r]
}

func (f *fakeWorker) Events(_ context.Context, req *api.EventsRequest) (*api.EventsResponse, error) {
	f.calls.Add(1)
	if f.fail.Add(-1) >= 0 {
		return nil, status.Error(codes.Unavailable, "injected failure")
	}
	return f.log.EventsAnswer(req), nil
}

func (f *fakeWorker) Dump(_ context.Context, req *api.DumpRequest) (*api.DumpResponse, error) {
	f.calls.Add(1)
	if f.fail.Add(-1) >= 0 {
		return nil, status.Error(codes.Unavailable, "injected failure")
	}
	return f.log.DumpAnswer(req), nil
}

func startFakeWorker(t *testing.T, e *natsbus.Embedded, id uint64, ring int) *fakeWorker {
	t.Helper()
	f := &fakeWorker{local: newTee(), rng: rand.New(rand.NewPCG(id, 7)), nextHash: id << 32}
	f.log = mustLog(t, id, ring, f.local)
	f.pub = NewPublisher(natstest.Connect(t, e.URL()), "m", f.log, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = ln.Addr().String()
	f.srv = grpc.NewServer()
	api.RegisterWorkerServer(f.srv, f)
	go f.srv.Serve(ln)
	t.Cleanup(f.srv.Stop)
	return f
}

func (f *fakeWorker) instance() discovery.Instance {
	return discovery.Instance{ID: f.log.instance, Model: "m", Role: "aggregated", GRPCAddr: f.addr, DPSize: max(f.dp, 1), BlockSize: 4}
}

// step makes one random cache change: store a new chain (sometimes
// extending an existing one, sometimes also on the host tier) or remove a
// whole chain leaf-first.
func (f *fakeWorker) step() []kv.Event {
	w := kv.WorkerKey{Instance: f.log.instance, DPRank: f.rank}
	if len(f.chains) > 4 && f.rng.IntN(3) == 0 {
		i := f.rng.IntN(len(f.chains))
		c := f.chains[i]
		f.chains = append(f.chains[:i], f.chains[i+1:]...)
		return []kv.Event{kv.Removed(w, kv.TierDevice, c)}
	}
	n := 1 + f.rng.IntN(4)
	var blocks []kv.StoredBlock
	var hashes []kv.EngineHash
	for range n {
		f.nextHash++
		blocks = append(blocks, kv.StoredBlock{EngineHash: kv.EngineHash(f.nextHash), LocalHash: kv.LocalHash(f.rng.Uint64()%64 + 1)})
		hashes = append(hashes, kv.EngineHash(f.nextHash))
	}
	var parent *kv.EngineHash
	if len(f.chains) > 0 && f.rng.IntN(3) == 0 {
		c := f.chains[f.rng.IntN(len(f.chains))]
		parent = &c[len(c)-1]
	}
	f.chains = append(f.chains, hashes)
	evs := []kv.Event{kv.Stored(w, kv.TierDevice, parent, blocks)}
	if f.rng.IntN(4) == 0 {
		evs = append(evs, kv.Stored(w, kv.TierHost, parent, blocks))
	}
	return evs
}

func (f *fakeWorker) publish(n int) {
	for range n {
		f.local.emit(f.step(), f.pub.Sink)
	}
}

// lose appends n steps to the log without publishing them: a gap.
func (f *fakeWorker) lose(n int) {
	for range n {
		f.local.emit(f.step(), func(b []kv.Event) { f.log.Append(b, nil) })
	}
}

func runFeed(t *testing.T, e *natsbus.Embedded, ap Applier, clients *workerclient.Pool) *Feed {
	t.Helper()
	feed, err := NewFeed(natstest.Connect(t, e.URL()), FeedConfig{Model: "m", Applier: ap, Repairer: workerclient.Repairer{Clients: clients}, RepairTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- feed.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return feed
}

// waitSynced waits until the feed has every rank of f up to its last event
// and the router index equals the worker's own.
func waitSynced(t *testing.T, feed *Feed, ix *lockedIndex, f *fakeWorker) {
	t.Helper()
	for rank := range uint32(max(f.dp, 1)) {
		w := kv.WorkerKey{Instance: f.log.instance, DPRank: rank}
		testutil.WaitFor(t, 10*time.Second, fmt.Sprintf("feed caught up on rank %d", rank), func() bool {
			last, ok := feed.LastID(w)
			return ok && last == f.log.LastID(rank)
		})
		got, want := ix.holdings(w), f.local.refHoldings(w)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("rank %d: router index differs from the worker's own: %d vs %d holdings", rank, len(got), len(want))
		}
	}
}

func TestEventFeedGapRepair(t *testing.T) {
	e := natstest.Start(t)
	clients := workerclient.NewPool()
	defer clients.Close()
	ix := &lockedIndex{ix: ref.New()}
	feed := runFeed(t, e, ix, clients)
	f := startFakeWorker(t, e, 0xabc, 16)

	f.publish(10) // before discovery: covered by the first dump
	feed.OnDiscovery(discovery.Event{Kind: discovery.InstanceAdded, Instance: f.instance()})
	waitSynced(t, feed, ix, f)
	if s := feed.Stats(); s.DumpRepairs != 1 {
		t.Fatalf("discovery dumps %d, want 1", s.DumpRepairs)
	}

	f.publish(20)
	waitSynced(t, feed, ix, f)

	// A short gap: repaired from the ring.
	f.lose(3)
	f.publish(5)
	waitSynced(t, feed, ix, f)
	if s := feed.Stats(); s.Gaps != 1 || s.RangeRepairs != 1 {
		t.Fatalf("after short gap: %+v", s)
	}

	// A gap longer than the ring: a full dump replaces the holdings.
	f.lose(40)
	f.publish(3)
	waitSynced(t, feed, ix, f)
	if s := feed.Stats(); s.Gaps != 2 || s.DumpRepairs != 2 {
		t.Fatalf("after long gap: %+v", s)
	}

	// Failing repairs are retried.
	f.fail.Store(2)
	f.lose(2)
	f.publish(2)
	waitSynced(t, feed, ix, f)
	if s := feed.Stats(); s.RepairErrors != 2 {
		t.Fatalf("repair errors %d, want 2", s.RepairErrors)
	}

	// Removal drops the holdings at once.
	w := kv.WorkerKey{Instance: f.log.instance}
	if len(ix.holdings(w)) == 0 {
		t.Fatal("no holdings before removal")
	}
	feed.OnDiscovery(discovery.Event{Kind: discovery.InstanceRemoved, Instance: f.instance()})
	testutil.WaitFor(t, 5*time.Second, "holdings dropped", func() bool { return len(ix.holdings(w)) == 0 })
	f.publish(5) // events of a removed instance are ignored
	time.Sleep(100 * time.Millisecond)
	if len(ix.holdings(w)) != 0 {
		t.Fatal("removed instance's events applied")
	}
}

func TestEventFeedBadInput(t *testing.T) {
	e := natstest.Start(t)
	clients := workerclient.NewPool()
	defer clients.Close()
	ix := &lockedIndex{ix: ref.New()}
	feed := runFeed(t, e, ix, clients)

	// An instance at an address nobody listens on: repairs fail and are
	// retried, nothing crashes.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	feed.OnDiscovery(discovery.Event{Kind: discovery.InstanceAdded, Instance: discovery.Instance{ID: 7, Model: "m", Role: "aggregated", GRPCAddr: dead, DPSize: 1, BlockSize: 4}})
	testutil.WaitFor(t, 10*time.Second, "repair errors counted", func() bool { return feed.Stats().RepairErrors >= 2 })

	// Garbage on event subjects is counted and skipped.
	nc := natstest.Connect(t, e.URL())
	good := startFakeWorker(t, e, 0x99, 64)
	feed.OnDiscovery(discovery.Event{Kind: discovery.InstanceAdded, Instance: good.instance()})
	nc.Publish(EventSubject("m", 0x99), []byte("\xff\xff garbage"))
	nc.Publish(EventSubject("m", 0x99), mustBatch(t, 0x98, kv.Event{ID: 1, Worker: kv.WorkerKey{Instance: 0x98}, Kind: kv.EventCleared}))
	nc.Publish(EventSubject("m", 0x99), mustBatch(t, 0x99, kv.Event{ID: 1, Worker: kv.WorkerKey{Instance: 0x99, DPRank: 5}, Kind: kv.EventCleared}))
	nc.Publish("kvmesh.events.m.nothex", []byte{})
	nc.Publish(EventSubject("m", 0x12345), mustBatch(t, 0x12345, kv.Event{ID: 1, Worker: kv.WorkerKey{Instance: 0x12345}, Kind: kv.EventCleared}))
	good.publish(5)
	waitSynced(t, feed, ix, good)
	testutil.WaitFor(t, 5*time.Second, "bad messages counted", func() bool {
		s := feed.Stats()
		return s.BadMessages >= 4 && s.UnknownInstance >= 1
	})
	feed.OnDiscovery(discovery.Event{Kind: discovery.InstanceRemoved, Instance: discovery.Instance{ID: 7}})
}

func mustBatch(t *testing.T, inst uint64, evs ...kv.Event) []byte {
	t.Helper()
	b, err := protoMarshalBatch(inst, evs)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestEventLogRangeAndDump(t *testing.T) {
	f := &fakeWorker{local: newTee(), rng: rand.New(rand.NewPCG(1, 2)), nextHash: 1 << 40}
	f.log = mustLog(t, 5, 32, f.local)
	f.lose(500)
	last := f.log.LastID(0)
	w := kv.WorkerKey{Instance: 5}
	evs, res := f.log.Range(w, last-31, last, 0)
	if res.TooOld || len(evs) != 32 || evs[0].ID != last-31 {
		t.Fatalf("range of the whole ring: %d events, %+v", len(evs), res)
	}
	if _, res := f.log.Range(w, last-32, last, 0); !res.TooOld {
		t.Fatal("range past the ring not too old")
	}
	if evs, res := f.log.Range(w, last, last+5, 0); !res.TooNew || len(evs) != 1 {
		t.Fatalf("range past the end: %d events %+v", len(evs), res)
	}
	if evs, _ := f.log.Range(kv.WorkerKey{Instance: 6}, last, last, 0); len(evs) != 0 {
		t.Fatal("answered for another instance")
	}
	dump, dl, ok := f.log.Dump(w)
	if !ok || dl != last {
		t.Fatalf("dump last %d want %d", dl, last)
	}
	rebuilt := ref.New()
	for _, e := range dump {
		rebuilt.Apply(e)
	}
	if got, want := rebuilt.Holdings(w), f.local.refHoldings(w); !reflect.DeepEqual(got, want) {
		t.Fatalf("dump rebuilds %d holdings, worker has %d", len(got), len(want))
	}
	if st := rebuilt.Stats(); st.ParentNotFound != 0 {
		t.Fatalf("dump order broken: %+v", st)
	}
	t.Logf("dump: %d events for %d holdings", len(dump), len(f.local.refHoldings(w)))
}

// Dumps rebuild exactly the worker's holdings, orphans included.
func TestDumpRebuildsExactly(t *testing.T) {
	for seed := range uint64(30) {
		f := &fakeWorker{local: newTee(), rng: rand.New(rand.NewPCG(seed, 3)), nextHash: 1 << 40}
		f.log = mustLog(t, 5, 0, f.local)
		w := kv.WorkerKey{Instance: 5}
		f.lose(400)
		dump, _, _ := f.log.Dump(w)
		rebuilt := ref.New()
		for _, e := range dump {
			rebuilt.Apply(e)
		}
		if got, want := rebuilt.Holdings(w), f.local.refHoldings(w); !reflect.DeepEqual(got, want) {
			t.Fatalf("seed %d: dump rebuilds %d holdings, worker has %d", seed, len(got), len(want))
		}
		if st := rebuilt.Stats(); st.ParentNotFound != 0 || st.RemoveUnknown != 0 {
			t.Fatalf("seed %d: %+v", seed, st)
		}
	}
}

func mustLog(t *testing.T, id uint64, ring int, idx Holdings) *EventLog {
	t.Helper()
	l, err := NewEventLog(id, ring, idx)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// A worker whose engine cannot list its holdings answers dumps with none,
// flagged, and the last event id: a router applying it clears the worker and
// resumes from there.
func TestDumpWithoutHoldings(t *testing.T) {
	l := mustLog(t, 5, 0, nil)
	w := kv.WorkerKey{Instance: 5}
	for i := range 3 {
		l.Append([]kv.Event{kv.Stored(w, kv.TierDevice, nil, []kv.StoredBlock{{EngineHash: kv.EngineHash(i + 1), LocalHash: 9}})}, nil)
	}
	if evs, last, ok := l.Dump(w); ok || len(evs) != 0 || last != 3 {
		t.Fatalf("dump %v last %d ok %v; want none, 3, false", evs, last, ok)
	}
	if a := l.DumpAnswer(&api.DumpRequest{Worker: api.KeyToProto(w)}); !a.NoInventory || len(a.Events) != 0 || a.LastId != 3 {
		t.Fatalf("answer %+v", a)
	}
}

// A worker of the feed's own process hands its batches over in process:
// with nobody else able to listen, nothing goes on NATS; when others may
// listen, they get every batch on NATS too while the feed skips those
// copies (no duplicates). Lost batches are repaired as before.
func TestEventFeedLocal(t *testing.T) {
	for _, alsoNATS := range []bool{false, true} {
		t.Run(fmt.Sprintf("alsoNATS=%v", alsoNATS), func(t *testing.T) { testEventFeedLocal(t, alsoNATS) })
	}
}

func testEventFeedLocal(t *testing.T, alsoNATS bool) {
	e := natstest.Start(t)
	clients := workerclient.NewPool()
	defer clients.Close()
	ix := &lockedIndex{ix: ref.New()}
	local := NewLocal(alsoNATS)
	feed, err := NewFeed(natstest.Connect(t, e.URL()), FeedConfig{Model: "m", Applier: ix, Repairer: workerclient.Repairer{Clients: clients},
		RepairTimeout: 2 * time.Second, Local: local})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- feed.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	f := startFakeWorker(t, e, 0xabc, 16)
	nc := natstest.Connect(t, e.URL())
	f.pub = NewPublisher(nc, "m", f.log, nil)
	f.pub.UseLocal(local)
	outside, err := natstest.Connect(t, e.URL()).SubscribeSync(f.pub.Subject())
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "feed attached", func() bool {
		local.mu.RLock()
		defer local.mu.RUnlock()
		return local.feeds["m"] == feed
	})
	feed.OnDiscovery(discovery.Event{Kind: discovery.InstanceAdded, Instance: f.instance()})
	waitSynced(t, feed, ix, f)

	f.publish(20)
	waitSynced(t, feed, ix, f)
	f.lose(3) // a gap, repaired from the ring
	f.publish(5)
	waitSynced(t, feed, ix, f)
	if s := feed.Stats(); s.Duplicates != 0 || s.Gaps != 1 || s.BadMessages != 0 || s.Batches < 25 {
		t.Fatalf("stats %+v: want 25 batches, no duplicates, the one gap, no bad messages", s)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := nc.Stats().OutMsgs; alsoNATS != (n == 25) || !alsoNATS && n != 0 {
		t.Fatalf("%d batches on NATS (others may listen: %v)", n, alsoNATS)
	}
	for i := range 25 {
		_, err := outside.NextMsg(time.Second)
		if alsoNATS && err != nil {
			t.Fatalf("outside subscriber, batch %d: %v", i, err)
		}
		if !alsoNATS && err == nil {
			t.Fatal("outside subscriber got a batch nobody outside the process should")
		}
		if !alsoNATS {
			break
		}
	}
}
