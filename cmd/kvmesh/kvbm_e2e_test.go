package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/frontend"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/kvbm/blobtier/blobtiertest"
)

// tierTokens sums a /metrics page's per-tier cached-token series.
func tierTokens(t *testing.T, base string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for k, v := range testutil.Scrape(t, strings.TrimSuffix(base, "/v1")+"/metrics") {
		if !strings.HasPrefix(k, "kvmesh_worker_cached_prompt_tokens_by_tier_total{") {
			continue
		}
		for _, tier := range []string{"device", "host", "disk", "object"} {
			if strings.Contains(k, `tier="`+tier+`"`) {
				out[tier] += v
			}
		}
	}
	return out
}

// fleetTierTokens sums a /metrics page's per-worker fleet series of the
// actual cached tokens by tier, and their all-tier total.
func fleetTierTokens(t *testing.T, base string) (byTier map[string]float64, total float64) {
	t.Helper()
	byTier = map[string]float64{}
	for k, v := range testutil.Scrape(t, strings.TrimSuffix(base, "/v1")+"/metrics") {
		switch {
		case strings.HasPrefix(k, "kvmesh_fleet_worker_cached_prompt_tokens_by_tier_total{"):
			_, tier, _ := strings.Cut(k, `tier="`)
			tier, _, _ = strings.Cut(tier, `"`)
			byTier[tier] += v
		case strings.HasPrefix(k, "kvmesh_fleet_worker_cached_prompt_tokens_total{"):
			total += v
		}
	}
	return byTier, total
}

// longPrompt is a distinct prompt of a few thousand tokens.
func longPrompt(i int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Document %d.", i)
	for w := range 1500 {
		fmt.Fprintf(&b, " w%d-%d", i, w)
	}
	return b.String()
}

// TestServeKVBMHostTier overflows a small device pool with distinct long
// prompts, then repeats the first: its prefix comes back from the host
// tier, usage counts it as cached, the answer is the same, and the
// worker metrics split the hit by tier.
func TestServeKVBMHostTier(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvmesh serve")
	}
	s := startServe(t, "--workers", "1", "--speedup-ratio", "0", "--connector", "kvbm",
		"--blocks", "256", "--kvbm-host-blocks", "4096")
	defer s.stop(t)
	client := newClient(s.base)
	first := longPrompt(0)
	plen := len(chatPromptTokens(t, simModel, frontend.Message{Role: "user", Content: first}))
	if plen*3 < 256*64 {
		t.Fatalf("prompt of %d tokens: too short to overflow the device tier in a few requests", plen)
	}
	r0 := chatOnce(t, client, chatParams(first, 5, 8))
	// Enough distinct prompts to evict the first from 256 device blocks.
	for i := 1; i <= 1+256*64/plen; i++ {
		chatOnce(t, client, chatParams(longPrompt(i), 5, 8))
	}
	r1 := chatOnce(t, client, chatParams(first, 5, 8))
	if r1.Choices[0].Message.Content != r0.Choices[0].Message.Content {
		t.Fatalf("repeat answered %q, first %q", r1.Choices[0].Message.Content, r0.Choices[0].Message.Content)
	}
	cached := int(r1.Usage.PromptTokensDetails.CachedTokens)
	if full := plen / 64 * 64; cached < full-64 {
		t.Fatalf("repeat of a %d-token prompt: %d cached tokens, want ≥ %d", plen, cached, full-64)
	}
	tiers := tierTokens(t, s.base)
	t.Logf("repeat of a %d-token prompt: %d cached; cached tokens by tier %v", plen, cached, tiers)
	if tiers["host"] < float64(cached)*0.9 || tiers["disk"] != 0 {
		t.Fatalf("cached tokens by tier %v; the repeat's %d should be the host's", tiers, cached)
	}
	// The frontend's per-worker series carry the same split: distinct
	// prompts hit nothing, the repeat hits the host tier.
	fleet, total := fleetTierTokens(t, s.base)
	t.Logf("fleet actual cached tokens by tier %v, total %v", fleet, total)
	if fleet["host"] < float64(cached)*0.9 || fleet["device"] != 0 || fleet["disk"] != 0 || fleet["peer"] != 0 {
		t.Fatalf("fleet cached tokens by tier %v; the repeat's %d should be the host's, none the device's", fleet, cached)
	}
	if sum := fleet["device"] + fleet["host"] + fleet["disk"] + fleet["external"] + fleet["peer"]; sum != total || total != tiers["host"]+tiers["device"] {
		t.Fatalf("fleet by tier %v sums to %v; all-tier total %v, the worker's own %v", fleet, sum, total, tiers)
	}
}

// TestServeKVBMObjectTier: a host tier no bigger than the device pool
// overflows too; what it evicts goes to the object tier (a file:// bucket),
// and the repeat of the first prompt loads its prefix from there, counted
// as cached and split by tier.
func TestServeKVBMObjectTier(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvmesh serve")
	}
	serveObjectTier(t, "file://"+t.TempDir())
}

// TestServeKVBMS3ObjectTier is TestServeKVBMObjectTier with the object
// tier in an S3 bucket (an in-process S3-compatible server on loopback,
// reached by the URL's endpoint and the AWS credentials in the
// environment); then a serve whose bucket is missing stops at start with
// one line naming the flag.
func TestServeKVBMS3ObjectTier(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvmesh serve")
	}
	srv := blobtiertest.NewS3(t, "kvmesh-g4")
	blobtiertest.SetEnv(t, blobtiertest.AccessKey)
	serveObjectTier(t, srv.URL("kvmesh-g4"))
	n := srv.Objects(t, "kvmesh-g4", "kvbm/")
	all, denied := srv.Requests()
	t.Logf("bucket holds %d block objects; %d requests", n, all)
	if n == 0 || denied != 0 {
		t.Fatalf("bucket holds %d block objects, %d requests denied", n, denied)
	}

	missing := srv.URL("no-such-bucket")
	p := startProc(t, "kvmesh serve with a missing bucket", "serve", "--listen", "127.0.0.1:0", "--log-level", "warn",
		"--workers", "1", "--connector", "kvbm", "--kvbm-host-blocks", "64", "--kvbm-object-url", missing, "--kvbm-object-blocks", "64")
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("serve with a missing bucket kept running")
	}
	stderr := strings.TrimSpace(p.Stderr())
	if want := fmt.Sprintf("--kvbm-object-url %q: bucket \"no-such-bucket\" does not exist", missing); p.Err() == nil ||
		!strings.Contains(stderr, want) || strings.Count(stderr, "\n") > 1 {
		t.Fatalf("serve with a missing bucket: exit %v, stderr:\n%s\nwant one line containing %q", p.Err(), stderr, want)
	}
}

// serveObjectTier runs serve with the object tier at url and checks a
// repeat is served from it, once the object writes have landed.
func serveObjectTier(t *testing.T, url string) {
	t.Helper()
	// The object queue holds every eviction of the run: the unthrottled
	// sim evicts faster than a bucket takes puts, and a full queue drops
	// the copy (kvbm/blobtier tests that), which would make the repeat's
	// hit depend on the machine's speed.
	s := startServe(t, "--workers", "1", "--speedup-ratio", "0", "--connector", "kvbm",
		"--blocks", "256", "--kvbm-host-blocks", "256", "--kvbm-object-url", url, "--kvbm-object-blocks", "4096",
		"--kvbm-object-queue", "4096")
	defer s.stop(t)
	client := newClient(s.base)
	first := longPrompt(0)
	plen := len(chatPromptTokens(t, simModel, frontend.Message{Role: "user", Content: first}))
	r0 := chatOnce(t, client, chatParams(first, 5, 8))
	// Enough distinct prompts to evict the first from device and host.
	for i := 1; i <= 2+2*256*64/plen; i++ {
		chatOnce(t, client, chatParams(longPrompt(i), 5, 8))
	}
	metrics := strings.TrimSuffix(s.base, "/v1") + "/metrics"
	sumOf := func(m map[string]float64, name string) (v float64) {
		for k, x := range m {
			if k == name || strings.HasPrefix(k, name+"{") {
				v += x
			}
		}
		return v
	}
	testutil.WaitFor(t, 30*time.Second, "the object writes to land", func() bool {
		return sumOf(testutil.Scrape(t, metrics), "kvmesh_kvbm_pending_object_blocks") == 0
	})
	if d := sumOf(testutil.Scrape(t, metrics), "kvmesh_kvbm_dropped_object_blocks_total"); d != 0 {
		t.Fatalf("%v object writes dropped", d)
	}
	r1 := chatOnce(t, client, chatParams(first, 5, 8))
	if r1.Choices[0].Message.Content != r0.Choices[0].Message.Content {
		t.Fatalf("repeat answered %q, first %q", r1.Choices[0].Message.Content, r0.Choices[0].Message.Content)
	}
	cached := int(r1.Usage.PromptTokensDetails.CachedTokens)
	if full := plen / 64 * 64; cached < full-64 {
		t.Fatalf("repeat of a %d-token prompt: %d cached tokens, want ≥ %d", plen, cached, full-64)
	}
	tiers := tierTokens(t, s.base)
	m := testutil.Scrape(t, metrics)
	var offloaded, onboarded float64
	for k, v := range m {
		if strings.HasPrefix(k, "kvmesh_kvbm_offloaded_object_blocks_total") {
			offloaded += v
		}
		if strings.HasPrefix(k, "kvmesh_kvbm_onboarded_object_blocks_total") {
			onboarded += v
		}
	}
	t.Logf("repeat of a %d-token prompt: %d cached; by tier %v; object blocks offloaded %v, onboarded %v", plen, cached, tiers, offloaded, onboarded)
	if tiers["object"] < float64(cached)/2 || onboarded == 0 || offloaded == 0 {
		t.Fatalf("cached tokens by tier %v, object blocks onboarded %v: the repeat's %d should come mostly from the object tier", tiers, onboarded, cached)
	}
	// The fleet names the object tier external, as the router's credit does.
	if fleet, _ := fleetTierTokens(t, s.base); fleet["external"] != tiers["object"] || fleet["host"] != tiers["host"] {
		t.Fatalf("fleet cached tokens by tier %v, the worker's own %v", fleet, tiers)
	}
}

// TestKVBMObjectURLProbed: an s3:// object tier is tried at the flag
// check: a missing bucket, a wrong key or a stalled endpoint stops the
// start with an error naming --kvbm-object-url, in bounded time.
func TestKVBMObjectURLProbed(t *testing.T) {
	srv := blobtiertest.NewS3(t, "kv")
	flags := func(u string) kvbmFlags {
		return kvbmFlags{connector: "kvbm", host: 8, object: 8, objURL: u, hostBW: 1, diskBW: 1, objBW: 1}
	}
	for _, c := range []struct {
		name, url, key, want string
	}{
		{"reachable", srv.URL("kv"), blobtiertest.AccessKey, ""},
		{"missing bucket", srv.URL("nope"), blobtiertest.AccessKey, fmt.Sprintf("--kvbm-object-url %q: bucket \"nope\" does not exist", srv.URL("nope"))},
		{"wrong key", srv.URL("kv"), "AKIAWRONG", fmt.Sprintf("--kvbm-object-url %q: cannot list bucket \"kv\": access denied", srv.URL("kv"))},
		{"typo in the query", srv.URL("kv", "use_path_stlye=true"), blobtiertest.AccessKey, `unknown query parameter "use_path_stlye"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			blobtiertest.SetEnv(t, c.key)
			k := flags(c.url)
			err := k.check(kv.RoleAggregated)
			if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
				t.Fatalf("check: %v, want %q", err, c.want)
			}
		})
	}
	if n := srv.Objects(t, "kv", ""); n != 0 {
		t.Fatalf("the probes left %d objects in the bucket", n)
	}
}

// TestKVBMFlagsChecked: a decode worker refuses the connector, and the
// tier flags need it.
func TestKVBMFlagsChecked(t *testing.T) {
	for _, c := range []struct {
		role string
		k    kvbmFlags
		want string
	}{
		{"decode", kvbmFlags{connector: "kvbm", host: 8, hostBW: 1, diskBW: 1}, "decode worker runs no connector"},
		{"aggregated", kvbmFlags{host: 8}, "--kvbm-* flags need --connector kvbm"},
		{"aggregated", kvbmFlags{hostBW: 1, diskBW: sim.DefaultDiskBandwidth}, "--kvbm-* flags need --connector kvbm"},
		{"aggregated", kvbmFlags{connector: "kvbm", host: 8, hostBW: 0, diskBW: 1}, "--kvbm-host-bandwidth 0"},
		{"aggregated", kvbmFlags{connector: "lmcache", host: 8}, `--connector "lmcache"`},
		{"aggregated", kvbmFlags{connector: "kvbm", hostBW: 1, diskBW: 1}, "give --kvbm-host-blocks or --kvbm-disk-blocks"},
		{"prefill", kvbmFlags{connector: "kvbm", disk: 8, hostBW: 1, diskBW: 1}, "--kvbm-disk-blocks 8: give --kvbm-disk-dir"},
		{"aggregated", kvbmFlags{connector: "kvbm", host: -1, hostBW: 1, diskBW: 1}, "--kvbm-host-blocks -1"},
		{"aggregated", kvbmFlags{objURL: "mem://", hostBW: sim.DefaultHostBandwidth, diskBW: sim.DefaultDiskBandwidth, objBW: sim.DefaultObjectBandwidth}, "--kvbm-* flags need --connector kvbm"},
		{"aggregated", kvbmFlags{connector: "kvbm", host: 8, object: 8, hostBW: 1, diskBW: 1, objBW: 1}, "--kvbm-object-blocks 8: give --kvbm-object-url"},
		{"aggregated", kvbmFlags{connector: "kvbm", host: 8, objURL: "file:///tmp/g4", hostBW: 1, diskBW: 1, objBW: 1}, "--kvbm-object-url \"file:///tmp/g4\": give --kvbm-object-blocks"},
		{"aggregated", kvbmFlags{connector: "kvbm", host: 8, object: 8, objURL: "s3:///prefix", hostBW: 1, diskBW: 1, objBW: 1}, "--kvbm-object-url \"s3:///prefix\": want s3://bucket"},
		{"aggregated", kvbmFlags{connector: "kvbm", host: 8, object: 8, objURL: "gs://bucket", hostBW: 1, diskBW: 1, objBW: 1}, "--kvbm-object-url \"gs://bucket\": gs:// is not built in"},
		{"aggregated", kvbmFlags{connector: "kvbm", host: 8, object: -1, hostBW: 1, diskBW: 1, objBW: 1}, "--kvbm-object-blocks -1"},
		{"aggregated", kvbmFlags{connector: "kvbm", host: 8, object: 8, objURL: "mem://", hostBW: 1, diskBW: 1}, "--kvbm-object-bandwidth 0"},
		{"aggregated", kvbmFlags{connector: "kvbm", host: 8, object: 8, objURL: "mem://", hostBW: 1, diskBW: 1, objBW: 1, objQueue: -1}, "--kvbm-object-queue -1"},
		{"aggregated", kvbmFlags{recompute: "1ms", objQueue: defaultObjectQueue, hostBW: sim.DefaultHostBandwidth, diskBW: sim.DefaultDiskBandwidth, objBW: sim.DefaultObjectBandwidth}, "--kvbm-* flags need --connector kvbm"},
		{"aggregated", kvbmFlags{connector: "kvbm", host: 8, hostBW: 1, diskBW: 1, objBW: 1, recompute: "fast"}, `--kvbm-recompute-per-token "fast": want off, auto or a positive duration`},
		{"aggregated", kvbmFlags{connector: "kvbm", host: 8, hostBW: 1, diskBW: 1, objBW: 1, recompute: "-1us"}, `--kvbm-recompute-per-token "-1us"`},
		{"aggregated", kvbmFlags{objQueue: 7, hostBW: sim.DefaultHostBandwidth, diskBW: sim.DefaultDiskBandwidth, objBW: sim.DefaultObjectBandwidth}, "--kvbm-* flags need --connector kvbm"},
	} {
		role, err := kv.ParseRole(c.role)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.k.check(role); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %+v: %v, want %q", c.role, c.k, err, c.want)
		}
	}
	ok := kvbmFlags{connector: "kvbm", host: 8, hostBW: 1, diskBW: 1, objBW: 1}
	if err := ok.check(kv.RolePrefill); err != nil {
		t.Errorf("prefill worker with a host tier: %v", err)
	}
	ok.objURL, ok.object = "file:///var/cache/kvmesh-g4", 1024
	if err := ok.check(kv.RoleAggregated); err != nil {
		t.Errorf("host and object tiers: %v", err)
	}
	for _, r := range []string{"off", "auto", "20us"} {
		ok.recompute = r
		if err := ok.check(kv.RoleAggregated); err != nil {
			t.Errorf("--kvbm-recompute-per-token %s: %v", r, err)
		}
	}
	if d, _ := parseRecompute("auto"); d != sim.RecomputeAuto {
		t.Errorf("auto parsed as %v", d)
	}
}
