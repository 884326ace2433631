package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/frontend"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/workerclient"
)

// The e2e tests run the real kvmesh binary, built once per test binary.

var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// kvmeshBin builds ./cmd/kvmesh once. KVMESH_TEST_BIN points at a prebuilt
// binary instead (handy while iterating on the tests alone).
func kvmeshBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("KVMESH_TEST_BIN"); p != "" {
		return p
	}
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "kvmesh-e2e-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "kvmesh")
		// The test runs in cmd/kvmesh: build this very package.
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// proc is a kvmesh subprocess whose stdout lines are scanned for a pattern.
type proc struct {
	t     *testing.T
	name  string
	cmd   *exec.Cmd
	lines chan string
	done  chan struct{}

	mu     sync.Mutex
	stderr bytes.Buffer
	err    error
}

func startProc(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, cmd: exec.Command(kvmeshBin(t), args...), lines: make(chan string, 256), done: make(chan struct{})}
	p.cmd.Stderr = writerFunc(func(b []byte) (int, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.stderr.Write(b)
	})
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			default:
			}
		}
		err := p.cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("stderr of %s (last 4 KiB):\n%s", name, tail(p.stderrText(), 4096))
		}
	})
	return p
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (p *proc) stderrText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// waitMatch returns the submatches of the first stdout line matching re.
func (p *proc) waitMatch(re *regexp.Regexp, timeout time.Duration) []string {
	p.t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l := <-p.lines:
			if m := re.FindStringSubmatch(l); m != nil {
				return m
			}
		case <-p.done:
			p.t.Fatalf("%s exited (%v) before printing %v; stderr:\n%s", p.name, p.err, re, tail(p.stderrText(), 4096))
		case <-deadline:
			p.t.Fatalf("%s printed no line matching %v within %v; stderr:\n%s", p.name, re, timeout, tail(p.stderrText(), 4096))
		}
	}
}

// interrupt sends SIGINT and returns the exit error once the process ended
// (nil: exit 0), or an error if it took longer than timeout.
func (p *proc) interrupt(timeout time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-p.done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.err
	case <-time.After(timeout):
		p.kill()
		return fmt.Errorf("%s did not exit within %v of SIGINT", p.name, timeout)
	}
}

// kill is a crash: SIGKILL, no clean-up in the process.
func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

var (
	serveLine    = regexp.MustCompile(`^kvmesh serve: .* OpenAI API at (http://\S+/v1) \(NATS (\S+)\)`)
	frontendLine = regexp.MustCompile(`^kvmesh frontend: .* OpenAI API at (http://\S+/v1)`)
	workerLine   = regexp.MustCompile(`^kvmesh worker ready instance=(\S+) grpc=(\S+) model=(\S+)`)
)

// served is a running `kvmesh serve`.
type served struct {
	*proc
	base    string // http://host:port/v1
	natsURL string
}

func startServe(t *testing.T, args ...string) *served {
	t.Helper()
	p := startProc(t, "kvmesh serve", append([]string{"serve", "--listen", "127.0.0.1:0", "--log-level", "warn"}, args...)...)
	m := p.waitMatch(serveLine, 30*time.Second)
	return &served{proc: p, base: m[1], natsURL: m[2]}
}

// stop interrupts serve and checks it exits 0 promptly.
func (s *served) stop(t *testing.T) {
	t.Helper()
	start := time.Now()
	if err := s.interrupt(10 * time.Second); err != nil {
		t.Errorf("kvmesh serve after SIGINT: %v; stderr:\n%s", err, tail(s.stderrText(), 4096))
	} else if d := time.Since(start); d > 5*time.Second {
		t.Errorf("kvmesh serve took %v to exit after SIGINT", d)
	}
}

func newClient(base string, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{option.WithBaseURL(base + "/"), option.WithAPIKey("unused"),
		option.WithMaxRetries(0), option.WithRequestTimeout(60 * time.Second)}, opts...)...)
}

// workerSet follows the workers of a model through discovery and talks to
// them over their gRPC API.
type workerSet struct {
	nc      interface{ Close() }
	watcher *discovery.Watcher
	clients *workerclient.Pool
	cancel  context.CancelFunc
}

func watchWorkers(t *testing.T, natsURL, model string, want int) *workerSet {
	t.Helper()
	nc, err := natsbus.Connect(natsbus.ConnConfig{URLs: natsURL, Name: "e2e-test"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ws := &workerSet{nc: nc, clients: workerclient.NewPool(), cancel: cancel}
	t.Cleanup(ws.close)
	d, err := discovery.Open(ctx, nc, discovery.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if ws.watcher, err = d.Watch(ctx, model, func(discovery.Event) {}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, fmt.Sprintf("%d workers in discovery", want), func() bool {
		return len(ws.watcher.Instances()) >= want
	})
	return ws
}

func (ws *workerSet) close() {
	if ws.watcher != nil {
		ws.watcher.Close()
	}
	ws.cancel()
	ws.clients.Close()
	ws.nc.Close()
}

// health asks every known worker for its health; the map is keyed by gRPC
// address.
func (ws *workerSet) health(t *testing.T) map[string]*api.HealthResponse {
	t.Helper()
	out := map[string]*api.HealthResponse{}
	for _, in := range ws.watcher.Instances() {
		c, err := ws.clients.Get(in)
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		h, err := c.Health(ctx, &api.HealthRequest{})
		cancel()
		if err == nil {
			out[in.GRPCAddr] = h
		}
	}
	return out
}

func (ws *workerSet) running(t *testing.T) (total int, busiest string) {
	best := uint32(0)
	for addr, h := range ws.health(t) {
		total += int(h.Running + h.Waiting)
		if h.Running > best {
			best, busiest = h.Running, addr
		}
	}
	return total, busiest
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// promptTokens is what the frontend's chat template makes of msgs.
func chatPromptTokens(t *testing.T, model string, msgs ...frontend.Message) []uint32 {
	t.Helper()
	m, err := frontend.BuiltinModel(model)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := m.EncodeChat(msgs)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// decode detokenizes ids as the frontend does (EOS dropped).
func decode(t *testing.T, model string, ids []uint32) string {
	t.Helper()
	m, err := frontend.BuiltinModel(model)
	if err != nil {
		t.Fatal(err)
	}
	d := m.NewDetokenizer()
	var b strings.Builder
	for _, id := range ids {
		eos := false
		for _, e := range m.EOS {
			eos = eos || e == id
		}
		if !eos {
			b.WriteString(d.Add(id))
		}
	}
	b.WriteString(d.Flush())
	return b.String()
}

// metric reads one unlabelled sample from /metrics.
func metric(t *testing.T, base, name string) (float64, bool) {
	t.Helper()
	resp, err := http.Get(strings.TrimSuffix(base, "/v1") + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err == nil {
				return f, true
			}
		}
	}
	return 0, false
}
