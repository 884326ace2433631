package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/api/apitest"
	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/natsbus/natstest"
	"github.com/kvmesh/kvmesh/workerclient"
)

// Fleet credentials between real processes: a `kvmesh frontend` and two
// `kvmesh worker`s started with mutual TLS (--tls-cert/--tls-key/--tls-ca),
// then with a fleet token (--fleet-token-file), serve traffic, and one
// worker pulls a hinted prefix from the other. A frontend started without
// the credentials gets no token from them (its Generate calls are refused),
// and a worker started without them fetches nothing from a credentialed
// peer (the request still completes, recomputed); both refusals are
// counted on the workers' /metrics. The frontend without credentials
// knows from discovery that the workers require them: each request fails
// at once with a 503 naming the flags, nothing is migrated, and it logs
// one line per worker.
func TestFleetCredentialsProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	pki := testutil.NewFleetPKI(t, "fleet")
	tokenFile := filepath.Join(t.TempDir(), "fleet.token")
	const token = "a-fleet-token-of-some-length"
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []struct {
		name    string
		flags   []string
		dial    []grpc.DialOption
		refused string // the worker series that counts a refused frontend
		logged  string // what the worker logs, once per host, for it
	}{
		{"mutual TLS", []string{"--tls-cert", pki.CertFile, "--tls-key", pki.KeyFile, "--tls-ca", pki.CAFile},
			[]grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(pki.Client))}, "kvmesh_worker_tls_handshake_failures_total",
			"refused a caller that failed the TLS handshake"},
		{"fleet token", []string{"--fleet-token-file", tokenFile},
			[]grpc.DialOption{workerclient.WithFleetToken(token)}, "kvmesh_worker_unauthenticated_total",
			"refused a caller without a valid proof of the fleet token"},
	} {
		t.Run(mode.name, func(t *testing.T) { credentialedFleet(t, mode.flags, mode.dial, mode.refused, mode.logged) })
	}
}

func credentialedFleet(t *testing.T, creds []string, dial []grpc.DialOption, refusedSeries, refusedLog string) {
	ns := natstest.Start(t)
	const model = "creds-e2e"
	worker := func(name, model string, withCreds bool) (*testutil.Proc, string) {
		args := []string{"worker", "--nats", ns.URL(), "--model", model, "--speedup-ratio", "0", "--block-size", "16",
			"--control-listen", "127.0.0.1:0", "--advertise-host", "127.0.0.1", "--metrics-listen", "127.0.0.1:0", "--log-level", "info"}
		if withCreds {
			args = append(args, creds...)
		}
		p := startProc(t, name, args...)
		m := p.Expect(workerLine, 30*time.Second)
		return p, m[1]
	}
	pa, idA := worker("worker A", model, true)
	pb, idB := worker("worker B", model, true)
	ws := watchWorkers(t, ns.URL(), model, 2)
	byToken := map[string]discovery.Instance{}
	for _, in := range ws.watcher.Instances() {
		byToken[natsbus.InstanceToken(in.ID)] = in
	}
	a, b := byToken[idA], byToken[idB]

	// Traffic through a credentialed frontend.
	fe := startProc(t, "frontend", append([]string{"frontend", "--nats", ns.URL(), "--model", model, "--listen", "127.0.0.1:0", "--log-level", "warn"}, creds...)...)
	base := fe.Expect(frontendLine, 30*time.Second)[1]
	waitHealthy(t, base)
	for i := range 4 {
		resp, body := testutil.Post(t, base+"/chat/completions", `{"model":"`+model+`","max_tokens":4,"messages":[{"role":"user","content":"hello `+strings.Repeat("x", i)+`"}]}`)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("credentialed frontend: %d %s", resp.StatusCode, body)
		}
	}

	// B pulls a prefix A computed, both credentialed: the test calls them
	// with the fleet's credentials, B's peer fetch presents its own.
	pool := workerclient.NewPool(dial...)
	defer pool.Close()
	ca, err := pool.Get(a)
	if err != nil {
		t.Fatal(err)
	}
	cb, err := pool.Get(b)
	if err != nil {
		t.Fatal(err)
	}
	turn1 := make([]uint32, 20*16)
	for i := range turn1 {
		turn1[i] = uint32(11 + i)
	}
	apitest.GenerateUsage(t, ca, &api.GenerateRequest{Tokens: turn1, MaxTokens: 2, Seed: 3})
	_, seq := kv.NewHasher(16, "", "").Blocks(turn1)
	hint := &api.KvFetchHint{MessageId: "creds", SourceControlEndpoint: a.ControlEndpoints[0]}
	for _, s := range seq {
		hint.BlockHashes = append(hint.BlockHashes, uint64(s))
	}
	turn2 := append(append([]uint32(nil), turn1...), 1, 2, 3)
	if u := apitest.GenerateUsage(t, cb, &api.GenerateRequest{Tokens: turn2, MaxTokens: 2, Seed: 3, KvFetch: hint}); u.GetCachedTokens() != uint32(len(seq)*16) {
		t.Fatalf("B cached %d tokens, want the %d fetched from A", u.GetCachedTokens(), len(seq)*16)
	}

	// A frontend without the credentials: a configuration error, not
	// dying workers — a 503 naming the flags for every request, no
	// migration, one log line per worker.
	bad := startProc(t, "frontend without credentials", "frontend", "--nats", ns.URL(), "--model", model, "--listen", "127.0.0.1:0", "--log-level", "warn", "--migration-limit", "3")
	badBase := bad.Expect(frontendLine, 30*time.Second)[1]
	waitHealthy(t, badBase)
	flags := creds[0]
	if flags == "--tls-cert" {
		flags = "--tls-cert/--tls-key/--tls-ca"
	}
	const tries = 6
	for i := range tries {
		start := time.Now()
		resp, body := testutil.Post(t, badBase+"/chat/completions", `{"model":"`+model+`","max_tokens":4,"messages":[{"role":"user","content":"let me in `+strings.Repeat("y", i)+`"}]}`)
		var e struct {
			Error struct{ Message, Type string }
		}
		_ = json.Unmarshal([]byte(body), &e)
		if resp.StatusCode != http.StatusServiceUnavailable || e.Error.Type != "service_unavailable" || !strings.Contains(e.Error.Message, flags) {
			t.Fatalf("a frontend without credentials: %d %s, want a 503 naming %s", resp.StatusCode, body, flags)
		}
		if i == 0 {
			t.Logf("a frontend without credentials: %d after %v: %s", resp.StatusCode, time.Since(start).Round(time.Millisecond), body)
		}
	}
	fm := testutil.Scrape(t, strings.TrimSuffix(badBase, "/v1")+"/metrics")
	if got := fm["kvmesh_frontend_migrations_total"]; got != 0 {
		t.Errorf("the frontend without credentials migrated %v times, want 0", got)
	}
	if got := seriesSum(fm, "kvmesh_fleet_credential_refusals_total"); got != tries {
		t.Errorf("kvmesh_fleet_credential_refusals_total = %v, want %d", got, tries)
	}
	if got := fm[`kvmesh_router_decisions_total{mode="kv",path="aggregated"}`]; got != tries {
		t.Errorf("routing decisions %v, want %d (one per request: no retries)", got, tries)
	}
	for _, id := range []uint64{a.ID, b.ID} {
		w := kv.WorkerKey{Instance: id}.String()
		if n := strings.Count(bad.Stderr(), "fleet credentials: worker "+w+" "); n > 1 {
			t.Errorf("worker %s logged %d times, want at most once", w, n)
		}
	}
	if n := strings.Count(bad.Stderr(), "fleet credentials:"); n < 1 || n > 2 || !strings.Contains(bad.Stderr(), flags) {
		t.Errorf("the frontend logged %d credential lines, want one per worker it chose naming %s:\n%s", n, flags, bad.Stderr())
	}

	// The workers still refuse a caller without the credentials (the
	// frontend above never called them: it knew from discovery).
	bare := workerclient.NewPool()
	defer bare.Close()
	for _, in := range []discovery.Instance{a, b} {
		cl, err := bare.Get(in)
		if err != nil {
			t.Fatal(err)
		}
		hctx, hcancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = cl.Health(hctx, &api.HealthRequest{})
		hcancel()
		if err == nil {
			t.Fatalf("worker %d answered a caller without credentials", in.ID)
		}
	}

	// A worker without the credentials (another model, so no frontend
	// routes to it) is sent a hint naming A: A serves it nothing, and the
	// request is recomputed.
	pc, _ := worker("worker C without credentials", "creds-intruder", false)
	wc := watchWorkers(t, ns.URL(), "creds-intruder", 1)
	cc, err := wc.clients.Get(wc.watcher.Instances()[0])
	if err != nil {
		t.Fatal(err)
	}
	if u := apitest.GenerateUsage(t, cc, &api.GenerateRequest{Tokens: turn2, MaxTokens: 2, Seed: 3, KvFetch: hint}); u.GetCachedTokens() != 0 {
		t.Fatalf("C (no credentials) cached %d tokens of A's", u.GetCachedTokens())
	}

	// A counts and logs the refusal on its own side, after C has its answer.
	testutil.WaitFor(t, 10*time.Second, "A to count C's refused fetch", func() bool {
		return workerMetrics(t, pa)[`kvmesh_transfer_refused_total{reason="unauthenticated"}`] >= 1 &&
			strings.Contains(pa.Stderr(), "transfer: refused a peer")
	})
	ma, mb, mc := workerMetrics(t, pa), workerMetrics(t, pb), workerMetrics(t, pc)
	if seriesSum(ma, refusedSeries) < 1 || seriesSum(mb, refusedSeries) < 1 {
		t.Errorf("the refused caller: %s on A %v, B %v, want ≥ 1 each", refusedSeries, seriesSum(ma, refusedSeries), seriesSum(mb, refusedSeries))
	}
	// Logged once per host, however often the caller redialled.
	if strings.Count(pa.Stderr(), refusedLog) != 1 || strings.Count(pb.Stderr(), refusedLog) != 1 {
		t.Errorf("the refused caller logged %d times on A and %d on B (%q), want once each", strings.Count(pa.Stderr(), refusedLog), strings.Count(pb.Stderr(), refusedLog), refusedLog)
	}
	if n := strings.Count(pa.Stderr(), "transfer: refused a peer"); n != 1 {
		t.Errorf("A logged the refused peer %d times, want 1", n)
	}
	if got := ma[`kvmesh_transfer_refused_total{reason="unauthenticated"}`]; got != 1 {
		t.Errorf("A's control endpoint counted %v refused peers, want 1 (C)", got)
	}
	if got := mb[`kvmesh_kv_hint_results_total{result="fetched"}`]; got != 1 {
		t.Errorf("B's fetched hints %v, want 1", got)
	}
	if got := mc[`kvmesh_kv_hint_results_total{result="fallback"}`]; got != 1 {
		t.Errorf("C's hint outcomes: fallback %v, want 1 (refused by A, recomputed)", got)
	}
}

// seriesSum adds every labelled series of name.
func seriesSum(m map[string]float64, name string) float64 {
	v := 0.0
	for k, x := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			v += x
		}
	}
	return v
}

func waitHealthy(t *testing.T, base string) {
	t.Helper()
	testutil.WaitFor(t, 20*time.Second, "frontend healthy", func() bool {
		r, err := http.Get(strings.TrimSuffix(base, "/v1") + "/health")
		if err == nil {
			r.Body.Close()
		}
		return err == nil && r.StatusCode == http.StatusOK
	})
}

// workerMetrics scrapes a worker process's --metrics-listen (its address
// from its log).
func workerMetrics(t *testing.T, p *testutil.Proc) map[string]float64 {
	t.Helper()
	var addr string
	testutil.WaitFor(t, 15*time.Second, "the worker's metrics address in its log", func() bool {
		m := metricsLine.FindStringSubmatch(p.Stderr())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	})
	return testutil.Scrape(t, "http://"+addr+"/metrics")
}
