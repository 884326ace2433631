package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/api/apitest"
	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/natsbus/natstest"
)

var metricsLine = regexp.MustCompile(`msg=metrics addr=(\S+)`)

// Two `kvmesh worker` processes with --control-listen: both register a
// loopback control endpoint; a request sent to B with a hint naming A's
// endpoint pulls the prefix A computed (B reports it cached), and B's
// --metrics-listen shows the fetch. A wildcard --advertise-host is refused
// before anything starts.
func TestWorkerProcessesPeerTransfer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ns := natstest.Start(t)
	const model = "peer-e2e"
	args := func(extra ...string) []string {
		return append([]string{"worker", "--nats", ns.URL(), "--model", model, "--speedup-ratio", "0", "--block-size", "16",
			"--control-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--log-level", "info"}, extra...)
	}
	bad := startProc(t, "wildcard worker", args("--advertise-host", "0.0.0.0")...)
	select {
	case <-bad.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("worker with a wildcard advertise host kept running")
	}
	if bad.Err() == nil || !strings.Contains(bad.Stderr(), "wildcard address is bind-only and cannot be advertised") {
		t.Fatalf("wildcard worker: exit %v, stderr:\n%s", bad.Err(), bad.Stderr())
	}

	pa := startProc(t, "worker A", args("--advertise-host", "127.0.0.1")...)
	pa.Expect(workerLine, 30*time.Second)
	pb := startProc(t, "worker B", args("--advertise-host", "127.0.0.1")...)
	mb := pb.Expect(workerLine, 30*time.Second)
	ws := watchWorkers(t, ns.URL(), model, 2)
	var a, b discovery.Instance
	for _, in := range ws.watcher.Instances() {
		if len(in.ControlEndpoints) != 1 || !strings.HasPrefix(in.ControlEndpoints[0], "tcp://127.0.0.1:") {
			t.Fatalf("instance %x control endpoints %v", in.ID, in.ControlEndpoints)
		}
		if in.Digest == "" {
			t.Errorf("instance %x publishes no compatibility digest", in.ID)
		}
		if natsbus.InstanceToken(in.ID) == mb[1] {
			b = in
		} else {
			a = in
		}
	}
	ca, err := ws.clients.Get(a)
	if err != nil {
		t.Fatal(err)
	}
	cb, err := ws.clients.Get(b)
	if err != nil {
		t.Fatal(err)
	}
	run := func(c api.WorkerClient, toks []uint32, hint *api.KvFetchHint) *api.Usage {
		return apitest.GenerateUsage(t, c, &api.GenerateRequest{Tokens: toks, MaxTokens: 3, Seed: 5, KvFetch: hint})
	}
	turn1 := make([]uint32, 30*16)
	for i := range turn1 {
		turn1[i] = uint32(7 + i)
	}
	run(ca, turn1, nil)
	_, seq := kv.NewHasher(16, "", "").Blocks(turn1)
	turn2 := append(append([]uint32(nil), turn1...), 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17)
	// The hint names A's blocks by A's engine hashes: a sim's are its
	// sequence hashes.
	hint := &api.KvFetchHint{MessageId: "e2e", SourceControlEndpoint: a.ControlEndpoints[0]}
	for _, s := range seq {
		hint.BlockHashes = append(hint.BlockHashes, uint64(s))
	}
	u := run(cb, turn2, hint)
	if u.GetCachedTokens() != uint32(len(seq)*16) {
		t.Fatalf("B cached %d tokens, want the %d fetched from A", u.GetCachedTokens(), len(seq)*16)
	}
	var addr string
	testutil.WaitFor(t, 15*time.Second, "B's metrics address in its log", func() bool {
		m := metricsLine.FindStringSubmatch(pb.Stderr())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	})
	got := testutil.Scrape(t, "http://"+addr+"/metrics")
	for k, want := range map[string]float64{`kvmesh_kv_hint_results_total{result="fetched"}`: 1, `kvmesh_transfer_blocks_total{operation="fetch"}`: 30,
		`kvmesh_transfer_duration_seconds_count{result="success",scope="fetch"}`: 1} {
		if v, ok := got[k]; !ok || v != want {
			t.Errorf("B's /metrics: %s = %v (present %v), want %v", k, v, ok, want)
		}
	}
}
