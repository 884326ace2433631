package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/eventplane"
	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/natsbus/natstest"
	"github.com/kvmesh/kvmesh/workerclient"
)

const kvcrGoodConfig = `{"publish_inventory":true,"kvcr_service_socket_path":null,"advertise_host":"127.0.0.1","control_port":23280}`

// kvcrWorkerArgs is a worker with --kvcr-inventory in front of an engine
// URL nothing serves: every refusal below must come before it is dialled.
func kvcrWorkerArgs(extra ...string) []string {
	return append([]string{"worker", "--nats", "nats://127.0.0.1:1", "--engine", "vllm", "--engine-url", "http://127.0.0.1:1",
		"--kvcr-inventory", "--kvcr-inventory-endpoint", "tcp://127.0.0.1:2", "--kvcr-extra-config", kvcrGoodConfig}, extra...)
}

// runExit1 runs the binary and wants exit status 1 with exactly want on
// stderr and nothing on stdout.
func runExit1(t *testing.T, bin string, args []string, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = os.Environ()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("%q: exit %v, want status 1; stderr %q", args, err, stderr.String())
		return
	}
	if stderr.String() != want {
		t.Errorf("%q: stderr %q\nwant %q", args, stderr.String(), want)
	}
	if stdout.Len() != 0 {
		t.Errorf("%q: printed %q on stdout", args, stdout.String())
	}
}

// Every topology linker inventory cannot describe is refused at start,
// from the worker's flags, with one line saying why; so are bad KVCR host
// settings, naming the option the operator sets.
func TestKVCRWorkerRefusals(t *testing.T) {
	bin := testutil.Binary(t)
	const gate = "kvmesh: --kvcr-inventory: unsupported engine topology (worker flags): "
	for _, c := range []struct {
		args []string
		want string
	}{
		{kvcrWorkerArgs("--tp", "2"), gate + "tensor parallel 2 (linker inventory is published at TP 1 only)\n"},
		{kvcrWorkerArgs("--dp-size", "2"), gate + "data parallel 2 (the inventory carries no DP rank)\n"},
		{kvcrWorkerArgs("--dp", "2"), gate + "data parallel 2 (the inventory carries no DP rank)\n"},
		{kvcrWorkerArgs("--attention-dp"), gate + "attention data parallel (ranks bind control ports the inventory does not name)\n"},
		{kvcrWorkerArgs("--context-parallel", "2"), gate + "context parallel 2 (each rank holds part of a block's KV)\n"},
		{kvcrWorkerArgs("--dcp", "2"), gate + "decode context parallel 2 (each rank holds part of a block's KV)\n"},
		{kvcrWorkerArgs("--pp", "2"), gate + "pipeline parallel 2 (each stage holds only its layers' KV)\n"},
		{kvcrWorkerArgs("--nnodes", "2"), gate + "2 nodes (one host's endpoint cannot serve a multi-node engine's blocks)\n"},
		{kvcrWorkerArgs("--tokenizer-workers", "2"), gate + "2 tokenizer workers (hints would reach only one of them)\n"},
		{kvcrWorkerArgs("--kvcr-extra-config", `{"publish_inventory":true,"advertise_host":"0.0.0.0","control_port":23280}`),
			"kvmesh: advertise_host in --hicache-storage-backend-extra-config (and --kvcr-extra-config) \"0.0.0.0\" is a wildcard, which no peer can dial: give this host's reachable address\n"},
		{kvcrWorkerArgs("--kvcr-extra-config", `{"publish_inventory":true,"advertise_host":"::1:23280","control_port":23280}`),
			"kvmesh: advertise_host in --hicache-storage-backend-extra-config (and --kvcr-extra-config) \"::1:23280\" is not an IPv6 address (an IPv6 address with a port must be bracketed, [addr]:port, and advertise_host takes no port)\n"},
		{kvcrWorkerArgs("--kvcr-extra-config", `{"advertise_host":"127.0.0.1","control_port":23280}`),
			"kvmesh: publish_inventory in --hicache-storage-backend-extra-config (and --kvcr-extra-config) is not true: the linker publishes no inventory\n"},
		{kvcrWorkerArgs("--kvcr-inventory-endpoint", "tcp://::1:5557"),
			"kvmesh: --kvcr-inventory-endpoint: endpoint \"tcp://::1:5557\": IPv6 host must be bracketed, as in tcp://[::1]:9000\n"},
		{kvcrWorkerArgs("--dp", "1", "--dp-size", "2"), "kvmesh: --dp 1 and --dp-size 2: one is an alias of the other, give one\n"},
		{kvcrWorkerArgs("--tp", "0"), "kvmesh: --tp 0: want at least 1\n"},
		{[]string{"worker", "--nats", "nats://127.0.0.1:1", "--kvcr-inventory"},
			"kvmesh: --kvcr-inventory takes a real engine's KVCR linker inventory: give --engine sglang (or another real engine) and --engine-url\n"},
		{[]string{"worker", "--nats", "nats://127.0.0.1:1", "--kvcr-inventory-endpoint", "tcp://127.0.0.1:2"}, "kvmesh: --kvcr-inventory-endpoint needs --kvcr-inventory\n"},
	} {
		runExit1(t, bin, c.args, c.want)
	}
	// The same refusal through the environment, as a deployment sets it.
	t.Setenv("KVMESH_PP", "4")
	runExit1(t, bin, kvcrWorkerArgs(), gate+"pipeline parallel 4 (each stage holds only its layers' KV)\n")
}

var kvcrInvLine = regexp.MustCompile(`^  kvcr inventory (\S+), replay (\S+) \(cache owner (\S+), topic (\S+)\)`)

type sglangMock struct {
	*mockProc
	inv, invReplay, owner string
}

// startMockSGLangKVCR runs `mock-engine sglang` with the KVCR linker on:
// host and disk tiers published as inventory.
func startMockSGLangKVCR(t *testing.T, name string, args ...string) *sglangMock {
	t.Helper()
	m := &sglangMock{mockProc: startMock(t, name, true, append([]string{"sglang", "--port", "0", "--model-path", "mock-model", "--page-size", "16", "--blocks", "1024",
		"--kv-events-endpoint", "tcp://127.0.0.1:0", "--kv-events-replay-endpoint", "tcp://127.0.0.1:0",
		"--enable-unified-cache-external-linker", "--unified-cache-external-linker-backend", "kvcr", "--hicache-storage-backend-extra-config", kvcrGoodConfig,
		"--kvcr-inventory-endpoint", "tcp://127.0.0.1:0", "--kvcr-inventory-replay-endpoint", "tcp://127.0.0.1:0",
		"--kvcr-host-blocks", "256", "--kvcr-disk-blocks", "256", "--kvcr-disk-dir", t.TempDir(), "--log-level", "warn"}, args...)...)()}
	inv := m.Expect(kvcrInvLine, 5*time.Second)
	m.inv, m.invReplay, m.owner = inv[1], inv[2], inv[3]
	return m
}

func (m *sglangMock) workerArgs(natsURL string, extra ...string) []string {
	return append([]string{"worker", "--engine", "sglang", "--engine-url", m.url, "--kv-events", m.events, "--kv-events-replay", m.replay,
		"--kvcr-inventory", "--kvcr-inventory-endpoint", m.inv, "--kvcr-inventory-replay", m.invReplay, "--kvcr-extra-config", kvcrGoodConfig,
		"--model", "mock-model", "--nats", natsURL, "--engine-timeout", "20s"}, extra...)
}

// TestKVCRInventoryE2E: a worker with --kvcr-inventory behind the SGLang
// stand-in validates the linker's inventory, registers the KVCR control
// endpoint, and its KVCR blocks (published as CPU and STORAGE, signed
// hashes) reach a router's index through the event plane on the host and
// disk tiers beside the engine's own device blocks. A worker whose
// inventory fails validation registers no endpoint, takes no hints and
// still serves; an engine whose own /get_server_info reports TP 2 is
// refused at start with one line.
func TestKVCRInventoryE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ns := natstest.Start(t)
	mock := startMockSGLangKVCR(t, "mock sglang")
	w := startProc(t, "worker", mock.workerArgs(ns.URL(), "--log-level", "warn")...)
	id := w.Expect(workerLine, 30*time.Second)[1]

	ws := watchWorkers(t, ns.URL(), "mock-model", 1)
	var in discovery.Instance
	for _, i := range ws.watcher.Instances() {
		in = i
	}
	if natsbus.InstanceToken(in.ID) != id || in.AcceptsHints == nil || !*in.AcceptsHints ||
		!slices.Equal(in.ControlEndpoints, []string{"tcp://127.0.0.1:23280"}) {
		t.Fatalf("registration %+v: want hints accepted and the linker's control endpoint", in)
	}

	ix := routerIndex(t, ns.URL())

	fe := startProc(t, "frontend", "frontend", "--nats", ns.URL(), "--model", "mock-model", "--listen", "127.0.0.1:0", "--log-level", "warn")
	base := fe.Expect(frontendLine, 30*time.Second)[1]
	prompt := tokenPrompt(6*16, 4242)
	testutil.WaitFor(t, 20*time.Second, "a completion through the frontend", func() bool {
		resp, err := tryCompletion(context.Background(), base, map[string]any{"model": "mock-model", "prompt": prompt, "max_tokens": 2})
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	local, _ := kv.NewHasher(16, "", "").Blocks(prompt)
	var m []index.Match
	testutil.WaitFor(t, 15*time.Second, "the prompt on device, host (CPU) and disk (STORAGE) in the router's index", func() bool {
		m = ix.FindMatches(local, m[:0])
		return len(m) == 1 && m[0].Depth == [kv.NumTiers]uint32{6, 6, 6, 6}
	}, func() string { return fmt.Sprintf("matches %+v", m) })
	c := ix.BlockCounts(m[0].Worker)
	if c[kv.TierHost] < 6 || c[kv.TierDisk] < 6 || c[kv.TierHost] != c[kv.TierDisk] {
		t.Fatalf("blocks per tier %v: every host block was written on to disk", c)
	}

	// Another worker pinned to a cache owner the linker is not: the
	// inventory is refused, nothing advertised, no hints, still serving.
	w2 := startProc(t, "worker pinned elsewhere", mock.workerArgs(ns.URL(), "--kvcr-cache-owner", "someone-else", "--log-level", "warn", "--metrics-listen", "127.0.0.1:0")...)
	id2 := w2.Expect(workerLine, 30*time.Second)[1]
	if !strings.Contains(w2.Stderr(), `kvcr inventory off: the linker's inventory failed validation`) || !strings.Contains(w2.Stderr(), `but --kvcr-cache-owner is \"someone-else\"`) {
		t.Fatalf("refusal not logged with its reason: %s", w2.Stderr())
	}
	ws2 := watchWorkers(t, ns.URL(), "mock-model", 2)
	for _, i := range ws2.watcher.Instances() {
		if natsbus.InstanceToken(i.ID) != id2 {
			continue
		}
		if len(i.ControlEndpoints) != 0 || i.AcceptsHints == nil || *i.AcceptsHints {
			t.Fatalf("a worker without the capability registered %+v", i)
		}
		wc, err := ws2.clients.Get(i)
		if err != nil {
			t.Fatal(err)
		}
		hr, err := wc.Health(context.Background(), &api.HealthRequest{})
		if err != nil || !hr.Ok {
			t.Fatalf("the worker without the capability does not serve: %+v %v", hr, err)
		}
	}

	// The engine's own account refuses a topology the flags did not
	// mention.
	tp2 := startMockSGLangKVCR(t, "mock sglang tp2", "--tp-size", "2")
	runExit1(t, testutil.Binary(t), tp2.workerArgs(ns.URL(), "--log-level", "error"),
		"kvmesh: --kvcr-inventory: unsupported engine topology (the engine's /get_server_info): tensor parallel 2 (linker inventory is published at TP 1 only)\n")
}

// routerIndex is the router's side of the event plane for mock-model: an
// index fed by an eventplane.Feed (NATS plus repair over the worker API),
// as serve and frontend run it.
func routerIndex(t *testing.T, natsURL string) *index.Index {
	t.Helper()
	nc, err := natsbus.Connect(natsbus.ConnConfig{URLs: natsURL, Name: "e2e-router-index"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	pool := workerclient.NewPool()
	t.Cleanup(pool.Close)
	ix := index.New()
	feed, err := eventplane.NewFeed(nc, eventplane.FeedConfig{Model: "mock-model", Applier: ix, Repairer: workerclient.Repairer{Clients: pool}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = feed.Run(ctx) }()
	d, err := discovery.Open(ctx, nc, discovery.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Watch(ctx, "mock-model", feed.OnDiscovery); err != nil {
		t.Fatal(err)
	}
	return ix
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestKVCREngineRestartE2E: the engine restarts under a running worker
// (same cache owner, same endpoints, KVCR's G3 lost with the process). The
// worker relays no device events here, so only the state agent feeds the
// router's index: the old epoch's host and disk blocks must leave it and
// the new epoch's arrive, none doubled.
//
// Behind KVMESH_KVCR_RESTART_E2E=1: the subscription's redial to the
// restarted publisher (zmq4's automatic reconnect) does not always come
// back within the test's 20 s on a loaded machine, and then nothing of the
// new epoch arrives. The agent's epoch handling itself is covered by
// kvcr's TestAgentCreditsTiersAndReplacesHoldingsPerEpoch.
func TestKVCREngineRestartE2E(t *testing.T) {
	if testing.Short() || os.Getenv("KVMESH_KVCR_RESTART_E2E") == "" {
		t.Skip("set KVMESH_KVCR_RESTART_E2E=1 (starts and restarts processes; see the comment)")
	}
	ns := natstest.Start(t)
	inv, rep, metricsPort := freePort(t), freePort(t), freePort(t)
	mockArgs := []string{"--port", strconv.Itoa(freePort(t)), "--kvcr-cache-owner", "node1-gpu0",
		"--kvcr-inventory-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", inv), "--kvcr-inventory-replay-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", rep)}
	mock := startMockSGLangKVCR(t, "mock sglang", mockArgs...)
	w := startProc(t, "worker", "worker", "--engine", "sglang", "--engine-url", mock.url, "--kvcr-inventory", "--kvcr-inventory-endpoint", mock.inv,
		"--kvcr-inventory-replay", mock.invReplay, "--kvcr-extra-config", kvcrGoodConfig, "--model", "mock-model", "--nats", ns.URL(),
		"--metrics-listen", fmt.Sprintf("127.0.0.1:%d", metricsPort), "--log-level", "warn")
	w.Expect(workerLine, 30*time.Second)
	ix := routerIndex(t, ns.URL())

	depth := func(prompt []uint32) [kv.NumTiers]uint32 {
		local, _ := kv.NewHasher(16, "", "").Blocks(prompt)
		if m := ix.FindMatches(local, nil); len(m) == 1 {
			return m[0].Depth
		}
		return [kv.NumTiers]uint32{}
	}
	var worker kv.WorkerKey
	run := func(base string, prompt []uint32) {
		t.Helper()
		testutil.WaitFor(t, 20*time.Second, "the engine served the prompt", func() bool {
			resp, err := tryCompletion(context.Background(), base, map[string]any{"model": "mock-model", "prompt": prompt, "max_tokens": 1})
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == 200
		})
	}
	// The agent's subscription connects (and after the restart reconnects)
	// on its own; the first live batch it sees makes it replay what it
	// missed. Short filler prompts keep the engine publishing until then.
	fillers := 0
	until := func(base, what string, cond func() bool, why func() string) {
		t.Helper()
		testutil.WaitFor(t, 20*time.Second, what, func() bool {
			if cond() {
				return true
			}
			fillers++
			run(base, tokenPrompt(2*16, uint32(20000+100*fillers)))
			time.Sleep(200 * time.Millisecond)
			return false
		}, why)
	}
	before := tokenPrompt(6*16, 7000)
	dbg := func() string {
		m := testutil.Scrape(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
		out := fmt.Sprintf("depth %v workers %v fillers %d index %+v;", depth(before), ix.Workers(), fillers, ix.Stats())
		for k, v := range m {
			if strings.Contains(k, "kvcr") || strings.Contains(k, "events") {
				out += fmt.Sprintf(" %s=%v", k, v)
			}
		}
		return out
	}
	// The router's feed follows the worker once its events arrive: before
	// that, what is published is not the test's.
	until(mock.url+"/v1", "the router's index following the worker", func() bool { return len(ix.Workers()) > 0 }, dbg)
	run(mock.url+"/v1", before)
	until(mock.url+"/v1", "epoch 1's KVCR blocks in the router's index", func() bool {
		return depth(before) == [kv.NumTiers]uint32{0, 6, 6, 6}
	}, dbg)
	for _, k := range ix.Workers() {
		worker = k
	}

	if err := mock.Stop(os.Interrupt, 10*time.Second); err != nil {
		t.Logf("mock stop: %v", err)
	}
	mock2 := startMockSGLangKVCR(t, "mock sglang restarted", mockArgs...)
	after := tokenPrompt(6*16, 9000)
	fillers = 0
	run(mock2.url+"/v1", after)
	until(mock2.url+"/v1", "epoch 2 replaced epoch 1 in the router's index", func() bool {
		return depth(after) == [kv.NumTiers]uint32{0, 6, 6, 6} && depth(before) == [kv.NumTiers]uint32{}
	}, func() string { return fmt.Sprintf("before %v after %v; ", depth(before), depth(after)) + dbg() })
	// Epoch 2's blocks only, each once: the 6 of the prompt and 2 per
	// filler, as many on disk as on host.
	testutil.WaitFor(t, 10*time.Second, "the fillers' blocks", func() bool {
		c := ix.BlockCounts(worker)
		return c == [kv.NumTiers]int{0, 6 + 2*fillers, 6 + 2*fillers, 0}
	}, func() string {
		return fmt.Sprintf("the owner holds %v per tier after the restart, want only epoch 2's %d host and disk blocks", ix.BlockCounts(worker), 6+2*fillers)
	})
	m := testutil.Scrape(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
	if m["kvmesh_kvcr_inventory_epochs_total"] < 1 || m["kvmesh_kvcr_inventory_released_blocks_total"] < 12 || m["kvmesh_kvcr_inventory_capable"] != 1 {
		t.Fatalf("agent metrics: epochs %v released %v capable %v", m["kvmesh_kvcr_inventory_epochs_total"],
			m["kvmesh_kvcr_inventory_released_blocks_total"], m["kvmesh_kvcr_inventory_capable"])
	}
}
