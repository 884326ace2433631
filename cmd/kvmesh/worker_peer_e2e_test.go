package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/hints"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/runtime"
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
	ns, err := runtime.StartEmbedded(runtime.EmbeddedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	const model = "peer-e2e"
	args := func(extra ...string) []string {
		return append([]string{"worker", "--nats", ns.URL(), "--model", model, "--speedup-ratio", "0", "--block-size", "16",
			"--control-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--log-level", "info"}, extra...)
	}
	bad := startProc(t, "wildcard worker", args("--advertise-host", "0.0.0.0")...)
	select {
	case <-bad.done:
	case <-time.After(20 * time.Second):
		t.Fatal("worker with a wildcard advertise host kept running")
	}
	if bad.err == nil || !strings.Contains(bad.stderrText(), "wildcard address is bind-only and cannot be advertised") {
		t.Fatalf("wildcard worker: exit %v, stderr:\n%s", bad.err, tail(bad.stderrText(), 1024))
	}

	pa := startProc(t, "worker A", args("--advertise-host", "127.0.0.1")...)
	pa.waitMatch(workerLine, 30*time.Second)
	pb := startProc(t, "worker B", args("--advertise-host", "127.0.0.1")...)
	mb := pb.waitMatch(workerLine, 30*time.Second)
	ws := watchWorkers(t, ns.URL(), model, 2)
	var a, b runtime.Instance
	for _, in := range ws.watcher.Instances() {
		if len(in.ControlEndpoints) != 1 || !strings.HasPrefix(in.ControlEndpoints[0], "tcp://127.0.0.1:") {
			t.Fatalf("instance %x control endpoints %v", in.ID, in.ControlEndpoints)
		}
		if in.Digest == "" {
			t.Errorf("instance %x publishes no compatibility digest", in.ID)
		}
		if runtime.InstanceToken(in.ID) == mb[1] {
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
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	run := func(c api.WorkerClient, toks []uint32, hint []byte) *api.Usage {
		st, err := c.Generate(ctx, &api.GenerateRequest{Tokens: toks, MaxTokens: 3, Seed: 5, KvHint: hint})
		if err != nil {
			t.Fatal(err)
		}
		var u *api.Usage
		for {
			ch, err := st.Recv()
			if errors.Is(err, io.EOF) {
				return u
			}
			if err != nil {
				t.Fatal(err)
			}
			if ch.Usage != nil {
				u = ch.Usage
			}
		}
	}
	turn1 := make([]uint32, 30*16)
	for i := range turn1 {
		turn1[i] = uint32(7 + i)
	}
	run(ca, turn1, nil)
	_, seq := kv.NewHasher(16, "", "").Blocks(turn1)
	turn2 := append(append([]uint32(nil), turn1...), 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17)
	u := run(cb, turn2, hints.NewFetch("e2e", a.ControlEndpoints[0], kv.RawHashes(seq)).Marshal())
	if u.GetCachedTokens() != uint32(len(seq)*16) {
		t.Fatalf("B cached %d tokens, want the %d fetched from A", u.GetCachedTokens(), len(seq)*16)
	}
	var addr string
	waitFor(t, 5*time.Second, "B's metrics address in its log", func() bool {
		m := metricsLine.FindStringSubmatch(pb.stderrText())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	})
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`kvmesh_kv_hint_results_total{result="fetched"} 1`, `kvmesh_transfer_blocks_total{operation="fetch"} 30`,
		`kvmesh_transfer_duration_seconds_count{result="success",scope="fetch"} 1`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("B's /metrics lacks %s", want)
		}
	}
}
