package attack

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/transfer"
)

// The control-plane probes of issue 23. Each names the probe it replays.

const (
	cpModel = "kvmesh-sim" // serve's default model; its subject token is itself
	cpToken = "cp-fleet-token-0123456789"
)

var cpServeLine = regexp.MustCompile(`^kvmesh serve: .* OpenAI API at (http://\S+/v1) \(NATS (\S+)\)`)

// cpServed is a running `kvmesh serve`.
type cpServed struct {
	*testutil.Proc
	base, natsURL string
}

func cpServe(t *testing.T, args ...string) *cpServed {
	t.Helper()
	p := testutil.Start(t, "kvmesh serve", testutil.Binary(t), nil,
		append([]string{"serve", "--listen", "127.0.0.1:0", "--workers", "1", "--speedup-ratio", "0", "--log-level", "info"}, args...)...)
	m := p.Expect(cpServeLine, 60*time.Second)
	return &cpServed{Proc: p, base: m[1], natsURL: m[2]}
}

// cpMetric is serve's metric name (the first series whose labels hold
// label; -1: none).
func (s *cpServed) cpMetric(t *testing.T, name, label string) float64 {
	t.Helper()
	for k, v := range testutil.Scrape(t, strings.TrimSuffix(s.base, "/v1")+"/metrics") {
		if (k == name || strings.HasPrefix(k, name+"{")) && strings.Contains(k, label) {
			return v
		}
	}
	return -1
}

// cpAwaitIndexed waits until the worker's published events reached the
// index: applied live, or (a batch that came before the feed knew the
// worker) by the dump its gap is repaired with.
func (s *cpServed) cpAwaitIndexed(t *testing.T) {
	t.Helper()
	testutil.WaitFor(t, 20*time.Second, "the worker's events in the index", func() bool {
		return s.cpMetric(t, "kvmesh_worker_event_batches_published_total", "") > 0 &&
			(s.cpMetric(t, "kvmesh_event_feed_events_applied_total", "") > 0 ||
				s.cpMetric(t, "kvmesh_event_feed_repairs_total", `kind="dump"`) > 0)
	})
}

func cpTokenFile(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "fleet.token")
	if err := os.WriteFile(f, []byte(cpToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// cpLogFields returns the fields of the first line of s's stderr holding
// msg, waiting for it.
func (s *cpServed) cpLogFields(t *testing.T, msg string) map[string]string {
	t.Helper()
	var line string
	testutil.WaitFor(t, 30*time.Second, "serve to log "+msg, func() bool {
		for _, l := range strings.Split(s.Stderr(), "\n") {
			if strings.Contains(l, msg) {
				line = l
				return true
			}
		}
		return false
	})
	return testutil.Fields(line)
}

// cpChat sends one chat request through serve and returns its status.
func (s *cpServed) cpChat(t *testing.T, text string) int {
	t.Helper()
	resp, _ := testutil.Post(t, s.base+"/chat/completions", `{"model":"`+cpModel+`","max_tokens":4,"messages":[{"role":"user","content":"`+text+`"}]}`)
	return resp.StatusCode
}

// cpIdentityKey is the nkey that proves NATS user name under token, built
// as docs/security.md describes: seed = HMAC-SHA256(HMAC-SHA256(token,
// "kvmesh/nats-identity"), "user:" + user).
func cpIdentityKey(t *testing.T, token, user string) nkeys.KeyPair {
	t.Helper()
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("kvmesh/nats-identity"))
	m2 := hmac.New(sha256.New, m.Sum(nil))
	m2.Write([]byte("user:" + user))
	kp, err := nkeys.FromRawSeed(nkeys.PrefixByteUser, m2.Sum(nil))
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

// cpConnectAs connects as user proving token; a server that
// authenticates no one takes the connection anonymously. Permission
// violations the server reports land on the returned channel.
func cpConnectAs(t *testing.T, url, token, user string) (*nats.Conn, <-chan error, error) {
	t.Helper()
	kp := cpIdentityKey(t, token, user)
	pub, _ := kp.PublicKey()
	errs := make(chan error, 16)
	opts := []nats.Option{nats.MaxReconnects(0), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errs <- err:
		default:
		}
	})}
	nc, err := nats.Connect(url, append(opts, nats.UserInfo(user, ""), nats.Nkey(pub, kp.Sign))...)
	if errors.Is(err, nats.ErrNkeysNotSupported) {
		nc, err = nats.Connect(url, opts...)
	}
	if err == nil {
		t.Cleanup(nc.Close)
	}
	return nc, errs, err
}

// cpPublishForgedBatch publishes, on victim's event subject, a batch in
// its name holding one event with id 2^40 (probe 3).
func cpPublishForgedBatch(t *testing.T, nc *nats.Conn, victim string) {
	t.Helper()
	id, err := strconv.ParseUint(victim, 16, 64)
	if err != nil {
		t.Fatalf("instance %q: %v", victim, err)
	}
	forged := kv.Cleared(kv.WorkerKey{Instance: id})
	forged.ID = 1 << 40
	b, err := proto.Marshal(&api.KvEventBatch{Instance: id, Events: api.EventsToProto([]kv.Event{forged})})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish("kvmesh.events."+cpModel+"."+victim, b); err != nil {
		t.Fatal(err)
	}
}

func cpRandomID() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])>>1 | 1
}

// Probe 1: serve's embedded NATS accepted any client. With defaults it
// now refuses a client without credentials, and one proving a guessed
// token.
func TestCPServeNATSRefusesStrangers(t *testing.T) {
	s := cpServe(t)
	if nc, err := nats.Connect(s.natsURL, nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Error("a client without credentials connected to serve's NATS")
	}
	if _, _, err := cpConnectAs(t, s.natsURL, "a-guessed-token-0123456789", "frontend"); err == nil {
		t.Error("a client proving a guessed token connected to serve's NATS")
	}
}

// cpFakeWorker is an attacker's worker API: it answers nothing and
// records the metadata of every call.
type cpFakeWorker struct {
	api.UnimplementedWorkerServer
	mu    sync.Mutex
	calls []metadata.MD
}

func (f *cpFakeWorker) record(ctx context.Context) {
	md, _ := metadata.FromIncomingContext(ctx)
	f.mu.Lock()
	f.calls = append(f.calls, md)
	f.mu.Unlock()
}

func (f *cpFakeWorker) seen() []metadata.MD {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]metadata.MD(nil), f.calls...)
}

func cpStartFake(t *testing.T) (*cpFakeWorker, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &cpFakeWorker{}
	srv := grpc.NewServer(
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			f.record(ctx)
			return h(ctx, req)
		}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			f.record(ss.Context())
			return h(srv, ss)
		}))
	api.RegisterWorkerServer(srv, f)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return f, ln.Addr().String()
}

// cpOpenNATS is a NATS server anyone on the host can reach: a fleet on a
// NATS without authentication, or an attacker who got onto it.
func cpOpenNATS(t *testing.T) *natsbus.Embedded {
	t.Helper()
	ns, err := natsbus.StartEmbedded(natsbus.EmbeddedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	return ns
}

// Probe 1, second half: on a NATS the attacker can write, a fake worker
// registered an idle record; the frontend sent it the fleet token as a
// bearer header on its first Dump and routed requests to it. Now the
// record, unsigned, is ignored: the fake gets no call at all, so neither a
// prompt nor anything reusable.
func TestCPForgedWorkerGetsNoTrafficNorSecret(t *testing.T) {
	ns := cpOpenNATS(t)
	s := cpServe(t, "--nats", ns.URL(), "--fleet-token-file", cpTokenFile(t))
	fake, addr := cpStartFake(t)
	nc, err := natsbus.Connect(natsbus.ConnConfig{URLs: ns.URL(), Name: "attacker"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d, err := discovery.Open(ctx, nc, discovery.Config{})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := d.Register(ctx, discovery.Instance{ID: cpRandomID(), Model: cpModel, Role: kv.RoleAggregated, GRPCAddr: addr,
		DPSize: 1, BlockSize: 16, KVCapacity: map[string]int{"device": 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(ctx)
	// Either the frontend skips the record (and says so) or it calls the
	// fake (a Dump at once, for a new instance).
	testutil.WaitFor(t, 30*time.Second, "the frontend to skip or call the fake worker", func() bool {
		return strings.Contains(s.Stderr(), "skipping bad record") || len(fake.seen()) > 0
	})
	for i := range 12 {
		if code := s.cpChat(t, "probe "+strconv.Itoa(i)); code != 200 {
			t.Errorf("request %d: status %d", i, code)
		}
	}
	calls := fake.seen()
	for _, md := range calls {
		for k, vs := range md {
			for _, v := range vs {
				if strings.Contains(v, cpToken) {
					t.Errorf("the fake worker received the fleet token in %s", k)
				}
			}
		}
	}
	if len(calls) != 0 {
		t.Errorf("the fake worker got %d calls; want none", len(calls))
	}
}

// Probe 2: deleting discovery records in a loop gave clients 503s. A
// worker identity (even one proving the fleet token: a misbehaving
// worker) may now neither delete nor overwrite another worker's record,
// nor publish on its event subject.
func TestCPWorkerCannotTouchAnothersRecordOrSubject(t *testing.T) {
	s := cpServe(t, "--fleet-token-file", cpTokenFile(t))
	victim := s.cpLogFields(t, `msg="worker started"`)["instance"]
	if victim == "" {
		t.Fatal("no instance in serve's log")
	}
	nc, errs, err := cpConnectAs(t, s.natsURL, cpToken, "worker."+strconv.FormatUint(cpRandomID(), 16))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	bucket, err := js.KeyValue(ctx, "kvmesh_instances")
	if err != nil {
		t.Fatal(err)
	}
	key := cpModel + "." + victim
	try := func(what string, op func(context.Context) error) {
		// A refused publish goes unanswered: the operation times out.
		octx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if err := op(octx); err == nil {
			t.Errorf("%s: allowed", what)
		}
	}
	try("deleting the victim's record", func(c context.Context) error { return bucket.Delete(c, key) })
	try("overwriting the victim's record", func(c context.Context) error {
		_, err := bucket.Put(c, key, []byte(`{}`))
		return err
	})
	cpPublishForgedBatch(t, nc, victim)
	nc.Flush()
	select {
	case err := <-errs:
		if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Errorf("publishing on the victim's event subject: %v, want a permissions violation", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("publishing on the victim's event subject: no permissions violation")
	}
	if code := s.cpChat(t, "still served"); code != 200 {
		t.Errorf("after the attempts: status %d", code)
	}
}

// Probe 3: one forged event batch (id 2^40) for a real worker made the
// feed retry its gap repair 151 times over 11 minutes. On a NATS the
// attacker can write, the batch now costs one dump: the worker is reset,
// no repair fails, and its next events reach the index. serve's own
// workers hand their batches to its feed in process, so there the
// forgery is skipped unread: no gap, no dump.
func TestCPForgedBatchCostsOneDump(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"worker over NATS", []string{"--worker-grpc"}},
		{"worker in process", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := cpOpenNATS(t)
			s := cpServe(t, append([]string{"--nats", ns.URL(), "--fleet-token-file", cpTokenFile(t)}, tc.args...)...)
			victim := s.cpLogFields(t, `msg="worker started"`)["instance"]
			metric := func(name string) float64 { return s.cpMetric(t, name, "") }
			feed := func(name string) float64 { return metric("kvmesh_event_feed_" + name) }
			// Prompts of several blocks (serve's default is 64 tokens), so the
			// worker stores blocks and publishes events.
			long := func(word string) string { return strings.Repeat(word+" ", 300) }
			if code := s.cpChat(t, long("before")); code != 200 {
				t.Fatalf("status %d", code)
			}
			s.cpAwaitIndexed(t)
			nc, err := natsbus.Connect(natsbus.ConnConfig{URLs: ns.URL(), Name: "attacker"})
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			cpPublishForgedBatch(t, nc, victim)
			if tc.args == nil {
				// The worker's own NATS copies are skipped as well: every
				// batch it published, and the forgery.
				testutil.WaitFor(t, 15*time.Second, "the forged batch skipped", func() bool {
					return feed("local_copies_skipped_total") == metric("kvmesh_worker_event_batches_published_total")+1
				})
				if n := feed("unfillable_gaps_total"); n != 0 {
					t.Errorf("%v unfillable gaps, want 0: the forgery reached the feed's core", n)
				}
			} else {
				testutil.WaitFor(t, 15*time.Second, "the forged gap found unfillable", func() bool { return feed("unfillable_gaps_total") >= 1 })
			}
			applied := feed("events_applied_total")
			if code := s.cpChat(t, long("after")); code != 200 {
				t.Fatalf("status %d", code)
			}
			testutil.WaitFor(t, 10*time.Second, "the worker's next events applied", func() bool { return feed("events_applied_total") > applied })
			if n := feed("repair_errors_total"); n != 0 {
				t.Errorf("%v repair errors, want 0", n)
			}
		})
	}
}

// serve with its own random token: nobody outside can subscribe to its
// NATS, so its workers' events stay in the process: they reach the index,
// and no copy goes on NATS for anyone (or the feed) to read.
func TestCPServeEventsStayInProcess(t *testing.T) {
	s := cpServe(t)
	if code := s.cpChat(t, strings.Repeat("local ", 300)); code != 200 {
		t.Fatalf("status %d", code)
	}
	s.cpAwaitIndexed(t)
	if n := s.cpMetric(t, "kvmesh_event_feed_local_copies_skipped_total", ""); n != 0 {
		t.Errorf("%v copies of the workers' batches came over NATS, want 0", n)
	}
}

// Probe 4: serve without a fleet token left its in-process workers' gRPC
// and transfer ports open to any local process. Now they refuse a caller
// that cannot prove serve's own (random) token.
func TestCPServeWorkerPortsRefuseStrangers(t *testing.T) {
	s := cpServe(t, "--hints")
	grpcAddr := s.cpLogFields(t, `msg="worker started"`)["grpc"]
	peer := s.cpLogFields(t, `msg="serving KV blocks to peers"`)
	endpoint := strings.Trim(peer["control_endpoints"], "[]")
	digest := strings.Trim(peer["digest"], `"`)
	cc, err := grpc.NewClient("passthrough:///"+grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	wc := api.NewWorkerClient(cc)
	if _, err := wc.Health(ctx, &api.HealthRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("worker API Health from a stranger: %v, want Unauthenticated", err)
	}
	st, err := wc.Generate(ctx, &api.GenerateRequest{RequestId: "stranger", Tokens: []uint32{1, 2, 3, 4}, MaxTokens: 2})
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("worker API Generate from a stranger: %v, want Unauthenticated", err)
	}
	cl := transfer.NewClient(transfer.ClientOptions{})
	defer cl.Close()
	res, _ := cl.Fetch(ctx, endpoint, transfer.FetchRequest{Hashes: []uint64{1, 2, 3}, Digest: digest})
	res.Release()
	if res.Outcome == transfer.OutcomeNotFound || res.Outcome == transfer.OutcomeSuccess || res.Outcome == transfer.OutcomePartial {
		t.Errorf("transfer fetch from a stranger: outcome %v, want a refusal", res.Outcome)
	}
}
