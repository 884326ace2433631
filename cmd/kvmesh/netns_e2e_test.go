package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/eventplane"
	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/workerclient"
)

// Network faults between hosts: NATS, a frontend and two workers each in
// their own network namespace (veth pairs on one bridge, a private /24),
// traffic with peer transfers across them, then latency and loss on a
// worker's link (tc netem; tbf rate shaping when the kernel has no netem)
// and a cut link (ip link set down). Root only, and behind KVMESH_NETNS=1
// because it runs for about half a minute:
//
//	sudo KVMESH_NETNS=1 go test ./cmd/kvmesh -run TestNetnsFaults -v
func TestNetnsFaults(t *testing.T) {
	lab := newNetLab(t)
	bin := testutil.Binary(t)
	natsBin := natsServerBinary(t)
	natsN := lab.node("nats", 10)
	feN := lab.node("fe", 20)
	w1N := lab.node("w1", 31)
	w2N := lab.node("w2", 32)
	netem := lab.netemWorks(w1N)
	if !netem {
		t.Log("tc netem is not available (no sch_netem in this kernel): latency is made by tbf rate shaping, and the loss phase is skipped")
	}

	ns := lab.start(natsN, "nats-server", natsBin, "-a", natsN.ip, "-p", "4222", "-js", "-sd", t.TempDir())
	testutil.WaitFor(t, 20*time.Second, "nats-server ready", func() bool { return strings.Contains(ns.Stderr(), "Server is ready") })
	natsURL := "nats://" + natsN.ip + ":4222"
	const model = "kvmesh-sim"
	worker := func(n *netNode) *testutil.Proc {
		p := lab.start(n, "worker "+n.name, bin, "worker", "--nats", natsURL, "--model", model, "--block-size", "16",
			"--listen", n.ip+":9000", "--control-listen", n.ip+":9100", "--advertise-host", n.ip, "--metrics-listen", n.ip+":9200",
			"--discovery-ttl", "2s", "--load-interval", "250ms", "--speedup-ratio", "4", "--log-level", "warn")
		p.Expect(workerLine, 30*time.Second)
		return p
	}
	worker(w1N)
	worker(w2N)
	fe := lab.start(feN, "frontend", bin, "frontend", "--nats", natsURL, "--model", model, "--listen", feN.ip+":8000",
		"--router-temperature", "1", "--log-level", "warn")
	base := fe.Expect(frontendLine, 30*time.Second)[1]
	testutil.WaitFor(t, 20*time.Second, "frontend healthy", func() bool {
		r, err := http.Get(strings.TrimSuffix(base, "/v1") + "/health")
		if err == nil {
			r.Body.Close()
		}
		return err == nil && r.StatusCode == http.StatusOK
	})
	obs := newIndexObserver(t, natsURL, model)

	load := newFaultLoad(base, model, 6)
	migrations := func() float64 { v, _ := metric(t, base, "kvmesh_frontend_migrations_total"); return v }
	type phase struct {
		name        string
		fault, heal func()
		hold        time.Duration
	}
	shape := []string{"tbf", "rate", "4mbit", "burst", "32kbit", "latency", "400ms"}
	latency := "tbf 4 Mbit/s shaping on w1's link (both directions)"
	if netem {
		shape = []string{"netem", "delay", "40ms", "10ms"}
		latency = "40 ms ± 10 ms netem delay on w1's link (both directions)"
	}
	phases := []phase{
		{name: "baseline", hold: 4 * time.Second},
		{name: latency, fault: func() { lab.qdisc(w1N, shape...) }, heal: func() { lab.noQdisc(w1N) }, hold: 5 * time.Second},
	}
	if netem {
		phases = append(phases, phase{name: "5% netem loss on w1's link (both directions)",
			fault: func() { lab.qdisc(w1N, "netem", "loss", "5%") }, heal: func() { lab.noQdisc(w1N) }, hold: 5 * time.Second})
	}
	phases = append(phases,
		phase{name: "w2's link cut for 6 s (ip link set down), then restored", fault: func() { lab.link(w2N, "down") }, heal: func() { lab.link(w2N, "up") }, hold: 6 * time.Second},
		phase{name: "after the faults", hold: 4 * time.Second})

	load.phase(phases[0].name)
	load.start()
	var rows []string
	for _, ph := range phases {
		m0 := migrations()
		load.phase(ph.name)
		if ph.fault != nil {
			ph.fault()
		}
		time.Sleep(ph.hold)
		if ph.heal != nil {
			ph.heal()
		}
		rows = append(rows, fmt.Sprintf("%s|%.0f", ph.name, migrations()-m0))
	}
	load.stop()

	// Peer transfers crossed namespaces: read both workers' fetch counters.
	var fetched, blocks float64
	outcomes := map[string]float64{}
	for _, n := range []*netNode{w1N, w2N} {
		m := testutil.Scrape(t, "http://"+n.ip+":9200/metrics")
		for k, v := range m {
			if r, ok := strings.CutPrefix(k, `kvmesh_kv_hint_results_total{result="`); ok {
				outcomes[strings.TrimSuffix(r, `"}`)] += v
			}
		}
		fetched += m[`kvmesh_kv_hint_results_total{result="fetched"}`] + m[`kvmesh_kv_hint_results_total{result="partial"}`]
		blocks += m[`kvmesh_transfer_blocks_total{operation="fetch"}`]
	}
	diverged := obs.divergence(t, 2, 20*time.Second)

	t.Logf("%-60s %6s %9s %7s %4s %5s %4s", "fault", "sent", "completed", "retried", "5xx", "other", "lost")
	var lost, bad int
	for i, ph := range phases {
		tl := load.tally(ph.name)
		retried := strings.SplitN(rows[i], "|", 2)[1]
		t.Logf("%-60s %6d %9d %7s %4d %5d %4d", ph.name, tl.sent, tl.completed, retried, tl.err5xx, tl.other, tl.lost)
		lost += tl.lost
		bad += tl.other
		if tl.sent == 0 {
			t.Errorf("phase %q sent no request", ph.name)
		}
	}
	t.Logf("hint outcomes on the workers %v; blocks fetched from peers %v; index blocks diverged from the workers' truth after repair: %d", outcomes, blocks, diverged)
	if lost != 0 {
		t.Errorf("%d requests lost (sent, never answered)", lost)
	}
	if bad != 0 {
		t.Errorf("%d requests answered neither 200 nor 5xx; first error: %s", bad, load.firstErr())
	}
	if diverged != 0 {
		t.Errorf("index diverges from the workers by %d blocks after repair", diverged)
	}
	if fetched == 0 {
		t.Error("no peer transfer crossed the namespaces")
	}
}

// netLab is a set of network namespaces on one bridge; everything it
// creates carries the prefix kvmt<pid> and is removed at the test's end,
// and a lab left behind by a dead test process is swept at the next start.
type netLab struct {
	t      *testing.T
	prefix string // kvmt<pid>
	subnet string // first three octets
	bridge string
}

type netNode struct {
	name, ns, hostIf, ip string
}

const netLabPrefix = "kvmt"

func newNetLab(t *testing.T) *netLab {
	t.Helper()
	if os.Getenv("KVMESH_NETNS") != "1" {
		t.Skip("set KVMESH_NETNS=1 (as root) to run the network-namespace fault test (about 30 s)")
	}
	if os.Geteuid() != 0 {
		t.Skip("the network-namespace fault test needs root (ip netns, veth, tc)")
	}
	for _, tool := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the network-namespace fault test needs %s (iproute2): %v", tool, err)
		}
	}
	sweepNetLabs(t)
	pid := os.Getpid()
	lab := &netLab{t: t, prefix: fmt.Sprintf("%s%d", netLabPrefix, pid), subnet: fmt.Sprintf("10.213.%d", pid%250+1)}
	lab.bridge = lab.prefix + "br"
	probe := lab.prefix + "-probe"
	if out, err := exec.Command("ip", "netns", "add", probe).CombinedOutput(); err != nil {
		t.Skipf("cannot create network namespaces here (ip netns add: %v: %s)", err, out)
	}
	_ = exec.Command("ip", "netns", "del", probe).Run()
	t.Cleanup(lab.remove)
	lab.ip("link", "add", lab.bridge, "type", "bridge")
	lab.ip("addr", "add", lab.subnet+".1/24", "dev", lab.bridge)
	lab.ip("link", "set", lab.bridge, "up")
	return lab
}

// sweepNetLabs removes namespaces and links of labs whose process is gone.
func sweepNetLabs(t *testing.T) {
	stale := func(name string) bool {
		rest, ok := strings.CutPrefix(name, netLabPrefix)
		if !ok {
			return false
		}
		end := 0
		for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
			end++
		}
		pid, err := strconv.Atoi(rest[:end])
		if err != nil {
			return false
		}
		_, err = os.Stat(fmt.Sprintf("/proc/%d", pid))
		return errors.Is(err, os.ErrNotExist)
	}
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) > 0 && stale(f[0]) {
				t.Logf("removing namespace %s left by a dead test", f[0])
				_ = exec.Command("ip", "netns", "del", f[0]).Run()
			}
		}
	}
	if out, err := exec.Command("ip", "-o", "link", "show").Output(); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			f := strings.Fields(l)
			if len(f) < 2 {
				continue
			}
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			if stale(name) {
				t.Logf("removing link %s left by a dead test", name)
				_ = exec.Command("ip", "link", "del", name).Run()
			}
		}
	}
}

func (l *netLab) ip(args ...string) string {
	l.t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		l.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// node creates namespace <prefix>-name with eth0 at subnet.octet, its veth
// peer on the bridge.
func (l *netLab) node(name string, octet int) *netNode {
	l.t.Helper()
	n := &netNode{name: name, ns: l.prefix + "-" + name, hostIf: l.prefix + name, ip: fmt.Sprintf("%s.%d", l.subnet, octet)}
	l.ip("netns", "add", n.ns)
	l.ip("link", "add", n.hostIf, "type", "veth", "peer", "name", "eth0", "netns", n.ns)
	l.ip("link", "set", n.hostIf, "master", l.bridge, "up")
	l.ip("-n", n.ns, "addr", "add", n.ip+"/24", "dev", "eth0")
	l.ip("-n", n.ns, "link", "set", "eth0", "up")
	l.ip("-n", n.ns, "link", "set", "lo", "up")
	return n
}

// start runs bin inside n's namespace (ip netns exec execs it: the process
// is bin itself, so Kill ends it).
func (l *netLab) start(n *netNode, name, bin string, args ...string) *testutil.Proc {
	l.t.Helper()
	return testutil.Start(l.t, name, "ip", nil, append([]string{"netns", "exec", n.ns, bin}, args...)...)
}

// netemWorks reports whether tc can attach a netem qdisc (the module may be
// missing from the kernel).
func (l *netLab) netemWorks(n *netNode) bool {
	err := exec.Command("ip", "netns", "exec", n.ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms").Run()
	if err == nil {
		_ = exec.Command("ip", "netns", "exec", n.ns, "tc", "qdisc", "del", "dev", "lo", "root").Run()
	}
	return err == nil
}

// qdisc puts the same root qdisc on both ends of n's link, so the fault
// applies to both directions.
func (l *netLab) qdisc(n *netNode, q ...string) {
	l.t.Helper()
	for _, cmd := range [][]string{
		append([]string{"tc", "qdisc", "replace", "dev", n.hostIf, "root"}, q...),
		append([]string{"ip", "netns", "exec", n.ns, "tc", "qdisc", "replace", "dev", "eth0", "root"}, q...),
	} {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			l.t.Fatalf("%s: %v: %s", strings.Join(cmd, " "), err, out)
		}
	}
}

func (l *netLab) noQdisc(n *netNode) {
	_ = exec.Command("tc", "qdisc", "del", "dev", n.hostIf, "root").Run()
	_ = exec.Command("ip", "netns", "exec", n.ns, "tc", "qdisc", "del", "dev", "eth0", "root").Run()
}

func (l *netLab) link(n *netNode, state string) { l.ip("link", "set", n.hostIf, state) }

// remove deletes the lab's namespaces (their veth ends go with them) and
// its bridge; it runs after the processes' own clean-ups have killed them.
func (l *netLab) remove() {
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], l.prefix+"-") {
				if out, err := exec.Command("ip", "netns", "del", f[0]).CombinedOutput(); err != nil {
					l.t.Errorf("ip netns del %s: %v: %s", f[0], err, out)
				}
			}
		}
	}
	if out, err := exec.Command("ip", "link", "del", l.bridge).CombinedOutput(); err != nil {
		l.t.Errorf("ip link del %s: %v: %s", l.bridge, err, out)
	}
}

// natsServerBinary builds the NATS server of the module's own dependency
// (github.com/nats-io/nats-server/v2) into the test's temporary directory, so
// a test can run it as a separate process (the go build cache makes a
// rebuild cheap).
func natsServerBinary(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "nats-server")
	if out, err := exec.Command("go", "build", "-o", p, "github.com/nats-io/nats-server/v2").CombinedOutput(); err != nil {
		t.Fatalf("go build nats-server: %v\n%s", err, out)
	}
	return p
}

// faultLoad sends streaming chat requests from c clients until stopped and
// accounts for every request under the phase it was sent in: completed
// (200 and a finish reason), 5xx (status or an in-stream error event),
// other (any other answer), lost (no answer: transport error or timeout).
type faultLoad struct {
	base, model string
	c           int
	client      *http.Client

	mu      sync.Mutex
	cur     string
	tallies map[string]*loadTally
	err     string
	done    chan struct{}
	wg      sync.WaitGroup
}

type loadTally struct{ sent, completed, err5xx, other, lost int }

func newFaultLoad(base, model string, c int) *faultLoad {
	return &faultLoad{base: base, model: model, c: c, client: &http.Client{Timeout: 60 * time.Second},
		tallies: map[string]*loadTally{}, done: make(chan struct{})}
}

func (l *faultLoad) phase(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cur = name
	if l.tallies[name] == nil {
		l.tallies[name] = &loadTally{}
	}
}

func (l *faultLoad) tally(name string) loadTally {
	l.mu.Lock()
	defer l.mu.Unlock()
	if tl := l.tallies[name]; tl != nil {
		return *tl
	}
	return loadTally{}
}

func (l *faultLoad) firstErr() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

func (l *faultLoad) start() {
	for i := range l.c {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for n := 0; ; n++ {
				select {
				case <-l.done:
					return
				default:
				}
				l.one(i, n)
			}
		}()
	}
}

func (l *faultLoad) stop() {
	close(l.done)
	l.wg.Wait()
}

// one sends a request whose system prompt a client shares across four
// requests in a row; with the router's softmax selection (the frontend runs
// with --router-temperature 1) some of them land on the worker that lacks
// the prefix, which fetches it from the other: peer transfers across
// namespaces.
func (l *faultLoad) one(client, n int) {
	var sys strings.Builder
	for w := range 120 {
		fmt.Fprintf(&sys, "client%d prefix%d word%d ", client, n/4, w)
	}
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":16,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}]}`,
		l.model, sys.String(), n)
	l.mu.Lock()
	tl := l.tallies[l.cur]
	tl.sent++
	l.mu.Unlock()
	outcome, why := l.send(body)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch outcome {
	case "completed":
		tl.completed++
	case "5xx":
		tl.err5xx++
	case "lost":
		tl.lost++
	default:
		tl.other++
	}
	if outcome != "completed" && l.err == "" {
		l.err = why
	}
}

func (l *faultLoad) send(body string) (outcome, why string) {
	resp, err := l.client.Post(l.base+"/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return "lost", err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 500 {
		return "5xx", resp.Status
	}
	if resp.StatusCode != http.StatusOK {
		return "other", resp.Status
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	finished := false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, `data: {"error"`):
			return "5xx", line
		case strings.Contains(line, `"finish_reason":"`):
			finished = true
		case line == "data: [DONE]":
			if finished {
				return "completed", ""
			}
			return "other", "stream ended without a finish reason"
		}
	}
	if err := sc.Err(); err != nil {
		return "lost", "stream cut: " + err.Error()
	}
	return "lost", "stream ended without [DONE]"
}

// indexObserver is a router's view of the event plane kept in the test
// process: the same eventplane.Feed, index and repairs as a frontend's, so
// its index can be compared with the workers' own inventories.
type indexObserver struct {
	ix      *index.Index
	watcher *discovery.Watcher
	repair  workerclient.Repairer
}

func newIndexObserver(t *testing.T, natsURL, model string) *indexObserver {
	t.Helper()
	nc, err := natsbus.Connect(natsbus.ConnConfig{URLs: natsURL, Name: "netns-observer"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithCancel(context.Background())
	pool := workerclient.NewPool()
	t.Cleanup(pool.Close)
	o := &indexObserver{ix: index.New(), repair: workerclient.Repairer{Clients: pool}}
	feed, err := eventplane.NewFeed(nc, eventplane.FeedConfig{Model: model, Applier: o.ix, Repairer: o.repair})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = feed.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	d, err := discovery.Open(ctx, nc, discovery.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if o.watcher, err = d.Watch(ctx, model, func(ev discovery.Event) {
		if ev.Kind == discovery.InstanceRemoved {
			pool.Forget(ev.Instance.ID)
		}
		feed.OnDiscovery(ev)
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.watcher.Close)
	sub, err := eventplane.SubscribeLoad(nc, model, feed.OnLoadReport, func(error) {})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return o
}

// divergence waits until want workers are discovered and the index holds
// exactly what each worker's inventory holds (tier, engine and local hash),
// up to timeout; it returns the blocks by which they still differ.
func (o *indexObserver) divergence(t *testing.T, want int, timeout time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(timeout)
	diff := -1
	for {
		ins := o.watcher.Instances()
		if len(ins) >= want {
			diff = 0
			for _, in := range ins {
				k := kv.WorkerKey{Instance: in.ID}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				truth, _, err := o.repair.Dump(ctx, in, k)
				cancel()
				if err != nil {
					diff = -1
					break
				}
				diff += blockSetDiff(blockSet(truth), blockSet(o.ix.Dump(k)))
			}
			if diff == 0 {
				return 0
			}
		}
		if time.Now().After(deadline) {
			if diff < 0 {
				t.Fatalf("after %v: %d of %d workers discovered, or a worker's inventory unreadable", timeout, len(ins), want)
			}
			return diff
		}
		time.Sleep(250 * time.Millisecond)
	}
}

type heldBlock struct {
	tier kv.Tier
	b    kv.StoredBlock
}

func blockSet(evs []kv.Event) map[heldBlock]bool {
	s := map[heldBlock]bool{}
	for _, e := range evs {
		for _, b := range e.Blocks {
			s[heldBlock{e.Tier, b}] = true
		}
	}
	return s
}

func blockSetDiff(a, b map[heldBlock]bool) int {
	n := 0
	for k := range a {
		if !b[k] {
			n++
		}
	}
	for k := range b {
		if !a[k] {
			n++
		}
	}
	return n
}
