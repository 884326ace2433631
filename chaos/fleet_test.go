package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/fleet"
	"github.com/kvmesh/kvmesh/internal/fleetkey"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/workerclient"
)

func TestMain(m *testing.M) { os.Exit(testutil.WithBinary(m).Run()) }

const model = "chaos"

var (
	frontendLine = regexp.MustCompile(`^kvmesh frontend: .* OpenAI API at (http://\S+)/v1`)
	workerLine   = regexp.MustCompile(`^kvmesh worker ready instance=(\S+) grpc=(\S+) model=(\S+)`)
	metricsLine  = regexp.MustCompile(`msg=metrics addr=(\S+)`)
)

// fleetConfig sizes the fleet under test.
type fleetConfig struct {
	Workers, Frontends int
	// StallTimeout is the workers' --stall-timeout; DiscoveryTTL their
	// record TTL (how long a frozen worker stays listed).
	StallTimeout, DiscoveryTTL time.Duration
}

// testFleet is the system under test: a NATS server run by the test (so
// it can be restarted on the same port and data directory), workers that
// reach it through a natsProxy and serve peers through a peerProxy each,
// frontend replicas with replica sync, and a failover client in front of
// them, as a load balancer would be.
type testFleet struct {
	t   *testing.T
	cfg fleetConfig
	bin string

	natsMu sync.Mutex
	nats   *natsbus.Embedded
	// The fleet runs authenticated: every process proves the token, the
	// test connects as the server's admin (kept across NATS restarts).
	tokenFile string
	admin     *natsbus.Credential
	natsPort  int
	natsDir   string
	proxy     *natsProxy

	mu        sync.Mutex
	workers   []*workerProc
	frontends []*frontendProc
	lb        *failover

	nc      *nats.Conn // the test's own connection: discovery, duplicated batches
	watcher *discovery.Watcher
	pool    *workerclient.Pool

	scr *scraper
	// removals counts instances discovery dropped (expired or deleted).
	removals atomic.Int64
}

type workerProc struct {
	*testutil.Proc
	id, grpc, metrics string
	peer              *peerProxy
	dead              atomic.Bool
}

type frontendProc struct {
	*testutil.Proc
	base string // http://host:port
	dead atomic.Bool
}

func startFleet(t *testing.T, cfg fleetConfig) *testFleet {
	t.Helper()
	fl := &testFleet{t: t, cfg: cfg, bin: testutil.Binary(t), natsDir: t.TempDir(), scr: newScraper()}
	fl.tokenFile = filepath.Join(t.TempDir(), "fleet.token")
	if err := os.WriteFile(fl.tokenFile, []byte(fleetToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var err error
	if fl.admin, err = natsbus.NewAdminCredential(); err != nil {
		t.Fatal(err)
	}
	ns, err := natsbus.StartEmbedded(fl.natsConfig(0))
	if err != nil {
		t.Fatal(err)
	}
	fl.nats, fl.natsPort = ns, ns.Port()
	t.Cleanup(func() {
		fl.natsMu.Lock()
		if fl.nats != nil {
			fl.nats.Shutdown()
		}
		fl.natsMu.Unlock()
	})
	fl.proxy = startNATSProxy(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(fl.natsPort)))
	// Workers first: the first process to create the discovery bucket sets
	// its TTL.
	for range cfg.Workers {
		fl.startWorker()
	}
	fl.lb = newFailover()
	for range cfg.Frontends {
		fl.startFrontend()
	}
	fl.nc, err = natsbus.Connect(natsbus.ConnConfig{URLs: fl.natsURL(), Name: "chaos-test", Credential: fl.admin, ReconnectWait: 100 * time.Millisecond, MaxReconnectWait: 250 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d, err := discovery.Open(ctx, fl.nc, discovery.Config{Key: fleetkey.Derive(fleetToken, fleetkey.Discovery)})
	if err != nil {
		t.Fatal(err)
	}
	if fl.watcher, err = d.Watch(ctx, model, func(ev discovery.Event) {
		if ev.Kind == discovery.InstanceRemoved {
			fl.removals.Add(1)
		}
	}); err != nil {
		t.Fatal(err)
	}
	fl.pool = workerclient.NewPool(workerclient.WithFleetToken(fleetToken))
	t.Cleanup(func() {
		fl.watcher.Close()
		cancel()
		fl.pool.Close()
		fl.nc.Close()
		fl.scr.stop()
	})
	fl.waitReady(30 * time.Second)
	fl.scr.start()
	return fl
}

// fleetToken is the chaos fleet's token: NATS identities, signed
// discovery records, worker API proofs and the transfer HMAC all derive
// from it.
const fleetToken = "chaos-fleet-token-0123456789"

// natsConfig is the fleet's NATS server on port (0: a free one).
func (fl *testFleet) natsConfig(port int) natsbus.EmbeddedConfig {
	return natsbus.EmbeddedConfig{Port: port, DataDir: fl.natsDir, FleetKey: fleetkey.Derive(fleetToken, fleetkey.NATS), Admin: fl.admin}
}

func (fl *testFleet) natsURL() string {
	return "nats://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(fl.natsPort))
}

// restartNATS stops the server, keeps it down for down, and starts it
// again on the same port and JetStream directory.
func (fl *testFleet) restartNATS(down time.Duration) {
	fl.natsMu.Lock()
	fl.nats.Shutdown()
	fl.nats = nil
	fl.natsMu.Unlock()
	time.Sleep(down)
	var err error
	var ns *natsbus.Embedded
	for range 50 { // the port may take a moment to be free again
		if ns, err = natsbus.StartEmbedded(fl.natsConfig(fl.natsPort)); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		fl.t.Errorf("restarting NATS on port %d: %v", fl.natsPort, err)
		return
	}
	fl.natsMu.Lock()
	fl.nats = ns
	fl.natsMu.Unlock()
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startWorker starts one sim worker: ~6 ms per token, 16-token blocks,
// control endpoint behind its own peerProxy, NATS through the fleet's proxy.
func (fl *testFleet) startWorker() *workerProc {
	t := fl.t
	t.Helper()
	ctrl := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))
	pp := startPeerProxy(t, ctrl)
	var p *testutil.Proc
	var m []string
	// A worker exits when NATS is unreachable at start (its supervisor
	// restarts it); so does this one, within a restart of NATS.
	for try := 0; ; try++ {
		p = testutil.Start(t, "kvmesh worker", fl.bin, []string{"KVMESH_FAULT_CONTROL_ADVERTISE=tcp://" + pp.addr()},
			"worker", "--nats", fl.proxy.url(), "--model", model, "--block-size", "16", "--blocks", "4096",
			"--speedup-ratio", "1", "--stall-timeout", fl.cfg.StallTimeout.String(), "--discovery-ttl", fl.cfg.DiscoveryTTL.String(),
			"--load-interval", "250ms", "--control-listen", ctrl, "--advertise-host", "127.0.0.1",
			"--metrics-listen", "127.0.0.1:0", "--log-level", "info", "--fleet-token-file", fl.tokenFile)
		var err error
		if m, err = p.WaitMatch(workerLine, 30*time.Second); err == nil {
			break
		} else if try == 10 {
			t.Fatal(err)
		}
		p.Kill()
		time.Sleep(time.Second)
	}
	w := &workerProc{Proc: p, id: m[1], grpc: m[2], peer: pp}
	testutil.WaitFor(t, 10*time.Second, "the worker's metrics address", func() bool {
		mm := metricsLine.FindStringSubmatch(p.Stderr())
		if mm != nil {
			w.metrics = mm[1]
		}
		return mm != nil
	})
	fl.scr.add("worker "+w.id, "http://"+w.metrics+"/metrics", &w.dead)
	fl.mu.Lock()
	fl.workers = append(fl.workers, w)
	fl.mu.Unlock()
	return w
}

// chaosAdminKey is the frontends' admin key: /debug/kv-index needs it.
const chaosAdminKey = "chaos-admin-key-0123456789"

func (fl *testFleet) startFrontend() *frontendProc {
	t := fl.t
	t.Helper()
	adminKeys := filepath.Join(t.TempDir(), "admin-keys")
	if err := os.WriteFile(adminKeys, []byte(chaosAdminKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := testutil.Start(t, "kvmesh frontend", fl.bin, nil, "frontend", "--nats", fl.natsURL(), "--listen", "127.0.0.1:0",
		"--model", model, "--router-replica-sync", "--router-temperature", "0.5", "--log-level", "warn", "--admin-key-file", adminKeys,
		"--fleet-token-file", fl.tokenFile)
	f := &frontendProc{Proc: p, base: p.Expect(frontendLine, 30*time.Second)[1]}
	fl.scr.add("frontend "+f.base, f.base+"/metrics", &f.dead)
	fl.mu.Lock()
	fl.frontends = append(fl.frontends, f)
	fl.mu.Unlock()
	fl.syncLB()
	return f
}

// syncLB points the load balancer at the frontends started so far that
// were not killed: the dead one stays in rotation until then, as behind a
// balancer whose health check has not noticed yet.
func (fl *testFleet) syncLB() {
	fl.mu.Lock()
	var hosts []string
	for _, f := range fl.frontends {
		if !f.dead.Load() {
			hosts = append(hosts, strings.TrimPrefix(f.base, "http://"))
		}
	}
	fl.mu.Unlock()
	fl.lb.set(hosts)
}

func (fl *testFleet) liveWorkers() []*workerProc {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	var out []*workerProc
	for _, w := range fl.workers {
		if !w.dead.Load() {
			out = append(out, w)
		}
	}
	return out
}

func (fl *testFleet) liveFrontends() []*frontendProc {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	var out []*frontendProc
	for _, f := range fl.frontends {
		if !f.dead.Load() {
			out = append(out, f)
		}
	}
	return out
}

// waitReady waits until every live frontend is healthy and routes to every
// live worker's key (its index view or /health may lag discovery).
func (fl *testFleet) waitReady(d time.Duration) {
	fl.t.Helper()
	want := len(fl.liveWorkers())
	testutil.WaitFor(fl.t, d, "frontends healthy and workers in discovery", func() bool {
		if len(fl.watcher.Instances()) < want {
			return false
		}
		for _, f := range fl.liveFrontends() {
			resp, err := http.Get(f.base + "/health")
			if err != nil {
				return false
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return false
			}
		}
		return true
	})
}

// running asks every listed worker for its running and waiting requests.
func (fl *testFleet) running() map[string]int {
	out := map[string]int{}
	for _, in := range fl.watcher.Instances() {
		c, err := fl.pool.Get(in)
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		h, err := c.Health(ctx, &api.HealthRequest{})
		cancel()
		if err == nil {
			out[natsbus.InstanceToken(in.ID)] = int(h.Running + h.Waiting)
		}
	}
	return out
}

// busyWorker waits for a live worker with streams in flight and returns
// the busiest.
func (fl *testFleet) busyWorker(d time.Duration) *workerProc {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		run := fl.running()
		var best *workerProc
		for _, w := range fl.liveWorkers() {
			if run[w.id] > 0 && (best == nil || run[w.id] > run[best.id]) {
				best = w
			}
		}
		if best != nil {
			return best
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// diverged compares every live frontend's index view with the workers'
// own inventories (their gRPC Dump): the blocks one side holds and the
// other not, summed over worker keys, tiers and frontends. A key the index
// holds blocks for but discovery no longer lists counts whole.
func (fl *testFleet) diverged() (n, held int, why string, err error) {
	truth := map[string]map[string][]kv.EngineHash{}
	for _, in := range fl.watcher.Instances() {
		c, err := fl.pool.Get(in)
		if err != nil {
			return 0, 0, "", err
		}
		for r := range max(in.DPSize, 1) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			resp, err := c.Dump(ctx, &api.DumpRequest{Worker: api.KeyToProto(kv.WorkerKey{Instance: in.ID, DPRank: uint32(r)})})
			cancel()
			if err != nil {
				return 0, 0, "", fmt.Errorf("dump of %x: %w", in.ID, err)
			}
			evs, err := api.EventsFromProto(resp.Events)
			if err != nil {
				return 0, 0, "", err
			}
			hb := fleet.HeldBlocks(evs)
			for _, hs := range hb {
				held += len(hs)
			}
			truth[natsbus.InstanceToken(in.ID)+"/"+strconv.Itoa(r)] = hb
		}
	}
	var whys []string
	for _, f := range fl.liveFrontends() {
		req, err := http.NewRequest("GET", f.base+"/debug/kv-index", nil)
		if err != nil {
			return 0, 0, "", err
		}
		req.Header.Set("Authorization", "Bearer "+chaosAdminKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, 0, "", err
		}
		var v fleet.IndexView
		err = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		if err != nil {
			return 0, 0, "", err
		}
		seen := map[string]bool{}
		for _, w := range v.Workers {
			k := w.Instance + "/" + strconv.Itoa(int(w.DPRank))
			seen[k] = true
			if d := diffBlocks(w.Blocks, truth[k]); d > 0 {
				n += d
				whys = append(whys, fmt.Sprintf("%s: worker %s differs by %d blocks", f.base, k, d))
			}
		}
		for k, held := range truth {
			if !seen[k] {
				if d := diffBlocks(nil, held); d > 0 {
					n += d
					whys = append(whys, fmt.Sprintf("%s: worker %s unknown to the index, holds %d blocks", f.base, k, d))
				}
			}
		}
	}
	return n, held, strings.Join(whys, "; "), nil
}

func diffBlocks(a, b map[string][]kv.EngineHash) int {
	n := 0
	for _, tier := range []string{"device", "host", "disk", "external"} {
		x, y := a[tier], b[tier]
		i, j := 0, 0
		for i < len(x) || j < len(y) {
			switch {
			case j == len(y) || (i < len(x) && x[i] < y[j]):
				n++
				i++
			case i == len(x) || y[j] < x[i]:
				n++
				j++
			default:
				i++
				j++
			}
		}
	}
	return n
}

// settle waits for the fleet to go idle, then for the indexes to match the
// workers (repair may still be running), and returns the divergence left
// after d and the blocks the workers hold.
func (fl *testFleet) settle(d time.Duration) (n, held int, why string) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		busy := 0
		for _, n := range fl.running() {
			busy += n
		}
		if busy == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	n, why = -1, "never compared"
	for time.Now().Before(deadline) {
		m, h, w, err := fl.diverged()
		if err == nil {
			n, held, why = m, h, w
			if n == 0 {
				return 0, held, ""
			}
		} else {
			why = err.Error()
		}
		time.Sleep(250 * time.Millisecond)
	}
	return n, held, why
}

// scraper polls every process's /metrics and keeps the last values it
// read, so a process that is killed keeps counting with what it had.
type scraper struct {
	mu    sync.Mutex
	procs []*scraped
	quit  chan struct{}
	wg    sync.WaitGroup
}

type scraped struct {
	name, url string
	dead      *atomic.Bool
	last      map[string]float64
}

func newScraper() *scraper { return &scraper{quit: make(chan struct{})} }

func (s *scraper) add(name, url string, dead *atomic.Bool) {
	s.mu.Lock()
	s.procs = append(s.procs, &scraped{name: name, url: url, dead: dead})
	s.mu.Unlock()
}

func (s *scraper) start() {
	s.wg.Go(func() {
		tick := time.NewTicker(300 * time.Millisecond)
		defer tick.Stop()
		for {
			s.poll()
			select {
			case <-s.quit:
				return
			case <-tick.C:
			}
		}
	})
}

func (s *scraper) stop() {
	select {
	case <-s.quit:
	default:
		close(s.quit)
	}
	s.wg.Wait()
}

func (s *scraper) poll() {
	s.mu.Lock()
	procs := slices.Clone(s.procs)
	s.mu.Unlock()
	for _, p := range procs {
		if p.dead.Load() {
			continue
		}
		m, err := scrape(p.url)
		if err != nil {
			continue
		}
		s.mu.Lock()
		p.last = m
		s.mu.Unlock()
	}
}

// sum is the total of a series over every process ever scraped: the exact
// key when it has labels (name{a="b"}), else every series of that name.
func (s *scraper) sum(series string) float64 {
	s.poll()
	s.mu.Lock()
	defer s.mu.Unlock()
	v := 0.0
	for _, p := range s.procs {
		if strings.Contains(series, "{") {
			v += p.last[series]
			continue
		}
		for k, x := range p.last {
			if k == series || strings.HasPrefix(k, series+"{") {
				v += x
			}
		}
	}
	return v
}

var scrapeClient = &http.Client{Timeout: time.Second}

// scrape reads a Prometheus text page into name{labels} → value.
func scrape(url string) (map[string]float64, error) {
	resp, err := scrapeClient.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if l == "" || l[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(l[i+1:], 64); err == nil {
			out[l[:i]] = v
		}
	}
	return out, sc.Err()
}

// failover is the client's load balancer: round robin over the frontends,
// and a request whose connection fails before any response (a replica that
// died) is sent to the next one, as a balancer retrying connect failures
// would. A stream cut after its response began cannot be replayed.
type failover struct {
	mu    sync.Mutex
	hosts []string
	next  int
	tr    *http.Transport
	tries atomic.Int64 // requests sent again to another replica
}

func newFailover() *failover {
	return &failover{tr: &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true,
		DialContext: (&net.Dialer{Timeout: 2 * time.Second}).DialContext}}
}

func (f *failover) set(hosts []string) {
	f.mu.Lock()
	f.hosts = hosts
	f.mu.Unlock()
}

func (f *failover) RoundTrip(req *http.Request) (*http.Response, error) {
	f.mu.Lock()
	hosts, start := slices.Clone(f.hosts), f.next
	f.next++
	f.mu.Unlock()
	if len(hosts) == 0 {
		return nil, fmt.Errorf("load balancer: no frontends")
	}
	var err error
	for i := range hosts {
		r := req.Clone(req.Context())
		if req.GetBody != nil {
			if r.Body, err = req.GetBody(); err != nil {
				return nil, err
			}
		}
		r.URL.Host = hosts[(start+i)%len(hosts)]
		r.Host = r.URL.Host
		resp, e := f.tr.RoundTrip(r)
		if e == nil {
			return resp, nil
		}
		err = e
		if req.Context().Err() != nil || req.GetBody == nil && req.Body != nil {
			break
		}
		f.tries.Add(1)
	}
	return nil, err
}

var (
	mockLine   = regexp.MustCompile(`^kvmesh mock-engine vllm: serving \S+ on (http://\S+) `)
	mockEvents = regexp.MustCompile(`^  rank 0: kv events (\S+), replay (\S+)`)
)

// engineWorker is a `kvmesh worker --engine vllm` in front of its own
// `kvmesh mock-engine vllm` process: a worker whose engine can hang while
// the worker process lives, which is what the stall watchdog is for.
type engineWorker struct {
	*workerProc
	engine *testutil.Proc
}

func (fl *testFleet) startEngineWorker() *engineWorker {
	t := fl.t
	t.Helper()
	eng := testutil.Start(t, "kvmesh mock-engine vllm", fl.bin, nil, "mock-engine", "vllm", model, "--port", "0",
		"--block-size", "16", "--blocks", "4096", "--speedup-ratio", "1",
		"--kv-events-endpoint", "tcp://127.0.0.1:0", "--kv-events-replay-endpoint", "tcp://127.0.0.1:0", "--log-level", "warn")
	url := eng.Expect(mockLine, 20*time.Second)[1]
	ev := eng.Expect(mockEvents, 5*time.Second)
	p := testutil.Start(t, "kvmesh worker --engine vllm", fl.bin, nil, "worker", "--engine", "vllm", "--engine-url", url,
		"--kv-events", ev[1], "--kv-events-replay", ev[2], "--model", model, "--nats", fl.proxy.url(),
		"--stall-timeout", fl.cfg.StallTimeout.String(), "--discovery-ttl", fl.cfg.DiscoveryTTL.String(), "--load-interval", "250ms",
		"--metrics-listen", "127.0.0.1:0", "--engine-timeout", "20s", "--log-level", "info")
	m := p.Expect(workerLine, 30*time.Second)
	w := &workerProc{Proc: p, id: m[1], grpc: m[2]}
	testutil.WaitFor(t, 10*time.Second, "the worker's metrics address", func() bool {
		mm := metricsLine.FindStringSubmatch(p.Stderr())
		if mm != nil {
			w.metrics = mm[1]
		}
		return mm != nil
	})
	fl.scr.add("worker "+w.id, "http://"+w.metrics+"/metrics", &w.dead)
	fl.mu.Lock()
	fl.workers = append(fl.workers, w)
	fl.mu.Unlock()
	return &engineWorker{workerProc: w, engine: eng}
}
