package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/frontend"
	"github.com/kvmesh/kvmesh/internal/fleetkey"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/workerclient"
)

// The e2e tests run the real kvmesh binary, built once per test binary.

func TestMain(m *testing.M) { os.Exit(testutil.WithBinary(m).Run()) }

// startProc starts a kvmesh subcommand; name labels it in failures.
func startProc(t *testing.T, name string, args ...string) *testutil.Proc {
	t.Helper()
	return testutil.Start(t, name, testutil.Binary(t), nil, args...)
}

var (
	serveLine    = regexp.MustCompile(`^kvmesh serve: .* OpenAI API at (http://\S+/v1) \(NATS (\S+)\)`)
	frontendLine = regexp.MustCompile(`^kvmesh frontend: .* OpenAI API at (http://\S+/v1)`)
	workerLine   = regexp.MustCompile(`^kvmesh worker ready instance=(\S+) grpc=(\S+) model=(\S+)`)
)

// served is a running `kvmesh serve`.
type served struct {
	*testutil.Proc
	base    string // http://host:port/v1
	natsURL string
}

// e2eFleetToken is the token startServe gives serve (unless the test
// gives its own), so a test joins serve's embedded NATS and calls its
// workers as serve's own frontend does (watchWorkers).
const e2eFleetToken = "e2e-fleet-token-0123456789"

// e2eTokenFile writes e2eFleetToken for --fleet-token-file.
func e2eTokenFile(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "fleet.token")
	if err := os.WriteFile(f, []byte(e2eFleetToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func startServe(t *testing.T, args ...string) *served {
	t.Helper()
	if !slices.Contains(args, "--fleet-token-file") {
		args = append([]string{"--fleet-token-file", e2eTokenFile(t)}, args...)
	}
	p := startProc(t, "kvmesh serve", append([]string{"serve", "--listen", "127.0.0.1:0", "--log-level", "warn"}, args...)...)
	m := p.Expect(serveLine, 30*time.Second)
	return &served{Proc: p, base: m[1], natsURL: m[2]}
}

// stop interrupts serve and checks it exits 0 promptly.
func (s *served) stop(t *testing.T) {
	t.Helper()
	start := time.Now()
	if err := s.Stop(syscall.SIGINT, 10*time.Second); err != nil {
		t.Errorf("kvmesh serve after SIGINT: %v; stderr:\n%s", err, s.Stderr())
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
	// The identity and proofs e2eFleetToken gives are what serve's
	// embedded NATS and workers require; other servers and workers
	// ignore them.
	cred, err := natsbus.FleetCredential(fleetkey.Derive(e2eFleetToken, fleetkey.NATS), natsbus.FrontendIdentity())
	if err != nil {
		t.Fatal(err)
	}
	nc, err := natsbus.Connect(natsbus.ConnConfig{URLs: natsURL, Name: "e2e-test", Credential: cred})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ws := &workerSet{nc: nc, clients: workerclient.NewPool(workerclient.WithFleetToken(e2eFleetToken)), cancel: cancel}
	t.Cleanup(ws.close)
	d, err := discovery.Open(ctx, nc, discovery.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if ws.watcher, err = d.Watch(ctx, model, func(discovery.Event) {}); err != nil {
		t.Fatal(err)
	}
	// Until the watcher has listed the bucket it knows no worker: a
	// caller waiting for fewer workers would pass at once.
	select {
	case <-ws.watcher.Synced():
	case <-time.After(15 * time.Second):
		t.Fatal("the discovery watcher never listed the bucket")
	}
	testutil.WaitFor(t, 15*time.Second, fmt.Sprintf("%d workers in discovery", want), func() bool {
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

// metric reads one series (name{label="value",...}) from base's /metrics.
func metric(t *testing.T, base, name string) (float64, bool) {
	t.Helper()
	v, ok := testutil.Scrape(t, strings.TrimSuffix(base, "/v1")+"/metrics")[name]
	return v, ok
}

// missingTool skips a test that needs a tool this machine lacks, naming
// it, or fails it under KVMESH_REQUIRE_TOOLS=1 (CI installs every tool).
func missingTool(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv("KVMESH_REQUIRE_TOOLS") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}
