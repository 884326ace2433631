package twin

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/tracefile"
)

const slicePath = "testdata/conversation_300.jsonl"

func loadSlice(t *testing.T) *Workload {
	t.Helper()
	wl, err := LoadWorkload(slicePath, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(wl.Requests) != 300 || len(wl.Skipped) != 0 {
		t.Fatalf("slice: %d requests, %d skipped", len(wl.Requests), len(wl.Skipped))
	}
	return wl
}

func run(t *testing.T, wl *Workload, cfg Config) *Result {
	t.Helper()
	r, err := Run(context.Background(), wl, cfg)
	if err != nil {
		t.Fatalf("mode %s: %v", cfg.Mode, err)
	}
	return r
}

// checkResult asserts the invariants every run must hold.
func checkResult(t *testing.T, r *Result) {
	t.Helper()
	if r.Requests+r.Rejected != r.Offered || r.TTFT.N != r.Requests || r.E2E.N != r.Requests {
		t.Fatalf("%s: %d completed + %d rejected of %d offered; %d TTFT, %d E2E samples", r.Mode, r.Requests, r.Rejected, r.Offered, r.TTFT.N, r.E2E.N)
	}
	h := r.Hit
	if h.DeviceTokens+h.PeerTokens > h.PromptTokens || h.DeviceTokens < 0 || h.PeerTokens < 0 {
		t.Fatalf("%s: hit tokens %+v", r.Mode, h)
	}
	if math.Abs(h.Total-(h.Device+h.Peers+h.Host+h.Disk)) > 1e-9 || h.Host != 0 || h.Disk != 0 {
		t.Fatalf("%s: hit split %+v", r.Mode, h)
	}
	for _, d := range []Dist{r.TTFT, r.E2E} {
		if d.N > 0 && !(d.P50 > 0 && d.P50 <= d.P90 && d.P90 <= d.P99 && d.P99 <= d.Max && d.Mean > 0 && d.Mean <= d.Max*(1+1e-9)) {
			t.Fatalf("%s: distribution %+v", r.Mode, d)
		}
	}
	if r.Requests > 0 && !(r.E2E.Mean >= r.TTFT.Mean && r.SimSeconds > 0 && r.OutputTokPerS > 0) {
		t.Fatalf("%s: E2E %v TTFT %v over %v s", r.Mode, r.E2E.Mean, r.TTFT.Mean, r.SimSeconds)
	}
	if r.Mode != ModeKVHints && (r.Hints != HintStats{} || h.PeerTokens != 0) {
		t.Fatalf("%s: hints without kv+hints: %+v", r.Mode, r.Hints)
	}
	if r.Hints.Errors != 0 || r.FetchErrors != 0 {
		t.Fatalf("%s: %d hint errors, %d fetch errors", r.Mode, r.Hints.Errors, r.FetchErrors)
	}
}

var lastLine = regexp.MustCompile(`^twin: mode=(\S+) requests=(\d+) hit=(\d+\.\d{4}) reachable=(\d+\.\d{4}) ttft_p50_ms=(\d+\.\d) ttft_mean_ms=(\d+\.\d) wall_s=(\d+\.\d{3})$`)

// TestTraceSliceAllModes runs the first 300 trace lines on 4 workers in
// every mode, twice, and checks invariants, the summary's last line and
// that the JSON and SVG reports are byte-identical across the two runs.
func TestTraceSliceAllModes(t *testing.T) {
	wl := loadSlice(t)
	var reports [2][]byte
	var svgs [2][]byte
	for pass := range 2 {
		var rs []*Result
		for _, m := range Modes {
			r := run(t, wl, Config{Mode: m, Workers: 4, Seed: 7})
			checkResult(t, r)
			if r.Requests != 300 {
				t.Fatalf("%s: %d of 300 completed", m, r.Requests)
			}
			var b bytes.Buffer
			if err := r.WriteSummary(&b); err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
			mm := lastLine.FindStringSubmatch(lines[len(lines)-1])
			if mm == nil || mm[1] != m || mm[2] != "300" {
				t.Fatalf("last line %q", lines[len(lines)-1])
			}
			rs = append(rs, r)
		}
		dir := t.TempDir()
		paths, err := WriteReport(dir, Report{Trace: "slice", TraceLines: 300, Config: Config{Workers: 4, Seed: 7}, Results: rs})
		if err != nil {
			t.Fatal(err)
		}
		if len(paths) != 3 {
			t.Fatalf("wrote %v", paths)
		}
		for _, p := range paths {
			b, err := os.ReadFile(p)
			if err != nil || len(b) == 0 {
				t.Fatalf("%s: %v (%d bytes)", p, err, len(b))
			}
			switch filepath.Ext(p) {
			case ".json":
				reports[pass] = b
			case ".svg":
				if !bytes.HasPrefix(b, []byte("<svg")) && !bytes.HasPrefix(b, []byte("<?xml")) {
					t.Fatalf("%s does not start like an SVG: %.40q", p, b)
				}
				for _, r := range rs {
					if !bytes.Contains(b, []byte(r.Mode)) {
						t.Fatalf("%s lacks mode %s", p, r.Mode)
					}
				}
				svgs[pass] = append(svgs[pass], b...)
			}
		}
		var tb bytes.Buffer
		if err := WriteComparison(&tb, rs); err != nil {
			t.Fatal(err)
		}
		if got := strings.Count(tb.String(), "\n"); got != len(Modes)+1 {
			t.Fatalf("comparison has %d lines:\n%s", got, tb.String())
		}
	}
	if !bytes.Equal(reports[0], reports[1]) {
		t.Fatal("same seed, different JSON reports")
	}
	if !bytes.Equal(svgs[0], svgs[1]) {
		t.Fatal("same seed, different SVG charts")
	}
	if !bytes.Contains(reports[0], []byte(`"mode": "kv+hints"`)) {
		t.Fatalf("report lacks kv+hints:\n%.400s", reports[0])
	}
}

// TestSeedMatters guards the determinism test: random routing with another
// seed must change something.
func TestSeedMatters(t *testing.T) {
	wl := loadSlice(t)
	a := run(t, wl, Config{Mode: string(router.ModeRandom), Workers: 4, Seed: 1})
	b := run(t, wl, Config{Mode: string(router.ModeRandom), Workers: 4, Seed: 2})
	if a.TTFT == b.TTFT && a.Hit == b.Hit {
		t.Fatalf("seeds 1 and 2 gave identical random-mode runs: %+v", a.TTFT)
	}
}

// req builds a trace request.
func req(line int, tsMS int64, out int, ids ...uint64) tracefile.Request {
	return tracefile.Request{Line: line, TimestampMS: tsMS, InputLength: len(ids) * 512, OutputLength: out, HashIDs: ids}
}

func ids(from uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = from + uint64(i)
	}
	return out
}

func workload(t *testing.T, reqs []tracefile.Request) *Workload {
	t.Helper()
	wl, err := NewWorkload(reqs, nil, 512)
	if err != nil {
		t.Fatal(err)
	}
	return wl
}

// TestKVBeatsRoundRobinOnSharedPrefixes: three groups of requests share a
// 16k-token prefix each; a worker holds about one and a half. Round-robin
// over four workers spreads every group over every worker and thrashes; kv
// keeps each group on a worker that holds its prefix.
func TestKVBeatsRoundRobinOnSharedPrefixes(t *testing.T) {
	var reqs []tracefile.Request
	const groups, rounds = 3, 16
	for r := range rounds {
		for g := range groups {
			i := r*groups + g
			p := append(ids(uint64(1000*(g+1)), 32), uint64(1_000_000+i))
			reqs = append(reqs, req(i+1, int64(i)*1000, 8, p...))
		}
	}
	wl := workload(t, reqs)
	cfg := Config{Workers: 4, Blocks: 400}
	cfg.Mode = string(router.ModeRoundRobin)
	rr := run(t, wl, cfg)
	cfg.Mode = string(router.ModeKV)
	kvr := run(t, wl, cfg)
	checkResult(t, rr)
	checkResult(t, kvr)
	if !(kvr.Hit.Total >= rr.Hit.Total+0.3 && kvr.Hit.Total > 0.7) {
		t.Fatalf("kv hit %.3f, round-robin %.3f", kvr.Hit.Total, rr.Hit.Total)
	}
	t.Logf("hit: kv %.3f, round-robin %.3f; mean TTFT: kv %.1f ms, round-robin %.1f ms", kvr.Hit.Total, rr.Hit.Total, kvr.TTFT.Mean, rr.TTFT.Mean)
	if kvr.TTFT.Mean >= rr.TTFT.Mean {
		t.Fatalf("kv mean TTFT %.1f ms ≥ round-robin %.1f ms", kvr.TTFT.Mean, rr.TTFT.Mean)
	}
	// The router's index is fed by the engines' events, so its prediction
	// matches what the engines found.
	if math.Abs(kvr.PredictedHit-kvr.Hit.Device) > 0.02 || kvr.IndexEvents == 0 {
		t.Fatalf("kv predicted %.3f, found %.3f, %d events", kvr.PredictedHit, kvr.Hit.Device, kvr.IndexEvents)
	}
}

// TestHintsFetchFromPeer: per group, a long request Y extends prefix P and
// decodes for a long time on one worker; 5 s later Z (P plus one block)
// arrives. kv sends Z to the idle worker, which recomputes P; kv+hints
// sends it there too, with a hint to copy P from Y's worker.
func TestHintsFetchFromPeer(t *testing.T) {
	var reqs []tracefile.Request
	const groups = 10
	for g := range groups {
		base := uint64(100_000 * (g + 1))
		p := ids(base, 16) // 8192 tokens = 128 blocks
		y := append(append([]uint64{}, p...), ids(base+50_000, 40)...)
		z := append(append([]uint64{}, p...), base+99_999)
		t0 := int64(g) * 60_000
		reqs = append(reqs, req(2*g+1, t0, 3000, y...), req(2*g+2, t0+5000, 4, z...))
	}
	wl := workload(t, reqs)
	// The block cost sends Z away from Y's worker (Y's active decode blocks
	// outweigh P's credit); the time cost would keep Z there, where its
	// TTFT is shortest, and plan no hint.
	blocks := router.BlockCost()
	cfg := Config{Workers: 2, Mode: string(router.ModeKV), Cost: &blocks}
	kvr := run(t, wl, cfg)
	cfg.Mode = ModeKVHints
	hr := run(t, wl, cfg)
	checkResult(t, kvr)
	checkResult(t, hr)
	hs := hr.Hints
	if hs.Hints < groups || hs.FetchedBlocks < groups*128 || hs.Misses != 0 {
		t.Fatalf("hints %+v", hs)
	}
	if hs.ModelledBytes != hs.FetchedBlocks*64*DefaultKVBytesPerToken || hs.PayloadBytes != hs.FetchedBlocks*sim.DefaultLayers*sim.DefaultPayloadSize {
		t.Fatalf("hint bytes %+v", hs)
	}
	if hr.Hit.PeerTokens < int64(groups*128*64) || hr.Hit.Total <= kvr.Hit.Total {
		t.Fatalf("kv+hints hit %+v, kv hit %+v", hr.Hit, kvr.Hit)
	}
	if hr.TTFT.Mean >= kvr.TTFT.Mean*0.9 {
		t.Fatalf("kv+hints mean TTFT %.1f ms, kv %.1f ms", hr.TTFT.Mean, kvr.TTFT.Mean)
	}
	// Free transfers make hinted requests faster still; a slow link
	// (1 GB/s: 1 GiB of KV per hint) makes them slower than priced ones.
	cfg.TransferBandwidth = -1
	free := run(t, wl, cfg)
	cfg.TransferBandwidth = 1e9
	slow := run(t, wl, cfg)
	if !(free.TTFT.Mean < hr.TTFT.Mean && slow.TTFT.Mean > hr.TTFT.Mean) {
		t.Fatalf("mean TTFT: free %.1f, 64 GB/s %.1f, 1 GB/s %.1f ms", free.TTFT.Mean, hr.TTFT.Mean, slow.TTFT.Mean)
	}
	t.Logf("kv: hit %.3f TTFT mean %.1f ms; kv+hints: hit %.3f (peers %.3f) TTFT mean %.1f ms, %d blocks fetched",
		kvr.Hit.Total, kvr.TTFT.Mean, hr.Hit.Total, hr.Hit.Peers, hr.TTFT.Mean, hs.FetchedBlocks)
}

// TestClosedLoop: with one client the requests never overlap, so the
// simulated span is the sum of their end-to-end latencies.
func TestClosedLoop(t *testing.T) {
	wl := loadSlice(t)
	wl.Requests = wl.Requests[:40]
	r := run(t, wl, Config{Mode: string(router.ModeKV), Workers: 2, Concurrency: 1})
	checkResult(t, r)
	sum := r.E2E.Mean * float64(r.E2E.N) / 1e3
	if r.Requests != 40 || math.Abs(sum-r.SimSeconds) > 1e-6*sum {
		t.Fatalf("%d requests, Σ E2E %.6f s, span %.6f s", r.Requests, sum, r.SimSeconds)
	}
	r8 := run(t, wl, Config{Mode: string(router.ModeKV), Workers: 2, Concurrency: 8})
	checkResult(t, r8)
	if !(r8.SimSeconds < r.SimSeconds/2) {
		t.Fatalf("8 clients took %.1f s, one took %.1f s", r8.SimSeconds, r.SimSeconds)
	}
}

func TestArrivalSpeedup(t *testing.T) {
	var reqs []tracefile.Request
	for i := range 20 {
		reqs = append(reqs, req(i+1, int64(i)*10_000, 2, uint64(i)))
	}
	wl := workload(t, reqs)
	a := run(t, wl, Config{Mode: string(router.ModeRoundRobin), Workers: 2})
	b := run(t, wl, Config{Mode: string(router.ModeRoundRobin), Workers: 2, ArrivalSpeedup: 4})
	// 19 gaps of 10 s, then one short request.
	if !(a.SimSeconds > 190 && a.SimSeconds < 191 && b.SimSeconds > 47.5 && b.SimSeconds < 48.5) {
		t.Fatalf("span %.2f s at 1×, %.2f s at 4×", a.SimSeconds, b.SimSeconds)
	}
}

func TestRejections(t *testing.T) {
	reqs := []tracefile.Request{
		req(1, 0, 4, 1, 2),
		{Line: 2, TimestampMS: 0, InputLength: 0, OutputLength: 4, HashIDs: []uint64{}},
		req(3, 0, 4, ids(10, 40)...), // 20480 tokens: more than 2 × 64 × 64 blocks hold
	}
	// A burst the router's busy threshold cuts off.
	for i := range 20 {
		reqs = append(reqs, req(10+i, 1000, 4, uint64(500+i)))
	}
	wl := workload(t, reqs)
	r := run(t, wl, Config{Mode: string(router.ModeKV), Workers: 2, Blocks: 128, MaxPrefillTokens: 600})
	checkResult(t, r)
	if r.RejectedInvalid != 2 || r.RejectedBusy == 0 || r.Requests < 3 {
		t.Fatalf("%d invalid, %d busy, %d completed; reasons %q", r.RejectedInvalid, r.RejectedBusy, r.Requests, r.RejectReasons)
	}
	joined := strings.Join(r.RejectReasons, "\n")
	if !strings.Contains(joined, "line 2: empty prompt") || !strings.Contains(joined, "KV blocks") {
		t.Fatalf("reasons %q", r.RejectReasons)
	}
}

func TestMalformedLines(t *testing.T) {
	good := `{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}`
	body := strings.Join([]string{good, `{"timestamp": 1, "input_length": 600`, good,
		`{"timestamp": 2, "input_length": 600, "output_length": 3, "hash_ids": [1]}`, good}, "\n")
	path := filepath.Join(t.TempDir(), "bad.jsonl")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	wl, err := LoadWorkload(path, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(wl.Requests) != 3 || len(wl.Skipped) != 2 || wl.Skipped[0].Line != 2 || wl.Skipped[1].Line != 4 {
		t.Fatalf("%d requests, skipped %v", len(wl.Requests), wl.Skipped)
	}
	r := run(t, wl, Config{Mode: string(router.ModeKV), Workers: 2})
	if r.Requests != 3 {
		t.Fatalf("%d completed", r.Requests)
	}
	_, err = LoadWorkload(path, LoadOptions{Strict: true})
	var le tracefile.LineError
	if !errors.As(err, &le) || le.Line != 2 || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("strict: %v", err)
	}
	if _, err := LoadWorkload(filepath.Join(t.TempDir(), "missing.jsonl"), LoadOptions{}); err == nil {
		t.Fatal("missing file loaded")
	}
}

func TestBadConfigAndCancel(t *testing.T) {
	wl := loadSlice(t)
	for _, c := range []Config{{Mode: "nope"}, {Mode: string(router.ModeKV), Workers: -1}, {Mode: string(router.ModeKV), ArrivalSpeedup: -1},
		{Mode: string(router.ModeKV), Concurrency: -2}, {Mode: string(router.ModeKV), TransferBandwidth: math.Inf(1)}, {Mode: string(router.ModeKV), KVBytesPerToken: -1}} {
		if _, err := Run(context.Background(), wl, c); err == nil {
			t.Fatalf("config %+v accepted", c)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, wl, Config{Mode: string(router.ModeKV)}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled run: %v", err)
	}
}

// TestTokenExpansion: equal hash ids give equal engine blocks, distinct
// ids and distinct offsets inside one id give distinct ones.
func TestTokenExpansion(t *testing.T) {
	a := tracefile.Request{InputLength: 1000, HashIDs: []uint64{7, 8}}
	b := tracefile.Request{InputLength: 700, HashIDs: []uint64{7, 9}}
	ta, tb := appendTokens(nil, &a, 512), appendTokens(nil, &b, 512)
	if len(ta) != 1000 || len(tb) != 700 {
		t.Fatalf("lengths %d %d", len(ta), len(tb))
	}
	if !slicesEqual(ta[:512], tb[:512]) || slicesEqual(ta[512:576], tb[512:576]) {
		t.Fatal("prefix sharing not reflected in tokens")
	}
	seen := map[string]bool{}
	for i := 0; i+64 <= len(ta); i += 64 {
		k := string(bytesOf(ta[i : i+64]))
		if seen[k] {
			t.Fatalf("engine block at %d repeats", i)
		}
		seen[k] = true
	}
}

func slicesEqual(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func bytesOf(ts []uint32) []byte {
	out := make([]byte, 0, 4*len(ts))
	for _, x := range ts {
		out = append(out, byte(x), byte(x>>8), byte(x>>16), byte(x>>24))
	}
	return out
}

func TestCDFSeriesThinning(t *testing.T) {
	xs := make([]float64, 10_000)
	for i := range xs {
		xs[i] = float64(len(xs) - i)
	}
	s := cdfSeries("m", xs, 100)
	if len(s.X) != 100 || s.X[0] != 1 || s.X[99] != 10_000 || s.Y[99] != 1 {
		t.Fatalf("thinned to %d points, ends (%v, %v)", len(s.X), s.X[0], s.X[len(s.X)-1])
	}
	for i := 1; i < len(s.X); i++ {
		if s.X[i] < s.X[i-1] || s.Y[i] <= s.Y[i-1] {
			t.Fatalf("not monotone at %d", i)
		}
	}
	if s := cdfSeries("m", xs[:50], 100); len(s.X) != 50 {
		t.Fatalf("short series thinned to %d", len(s.X))
	}
}

// TestPromptHasher: the memoised hashes and tails equal hashing the full
// expansion, for prompts ending mid trace block and mid engine block, with
// repeated and fresh hash ids; blocks straddling trace blocks take the
// expanding path.
func TestPromptHasher(t *testing.T) {
	if newPromptHasher(512, 48) != nil || newPromptHasher(0, 64) != nil {
		t.Fatal("a hasher for engine blocks that straddle trace blocks")
	}
	p := newPromptHasher(512, 64)
	small := newPromptHasher(512, 64)
	small.cbits = 4 // chunks of two hash ids: most ids start a new chunk
	seed := kv.Seed("", "")
	for _, rq := range []tracefile.Request{
		{InputLength: 1000, HashIDs: []uint64{7, 8}},
		{InputLength: 700, HashIDs: []uint64{7, 9}},
		{InputLength: 1024, HashIDs: []uint64{8, 7}},
		{InputLength: 63, HashIDs: []uint64{9}},
		{InputLength: 5000, HashIDs: []uint64{1, 2, 3}},             // length capped by the ids
		{InputLength: 1100, HashIDs: []uint64{1 << 40, 7, 1 << 40}}, // ids past the dense range
	} {
		toks := appendTokens(nil, &rq, 512)
		plen := tracefile.TokenLen(&rq, 512)
		want := kv.LocalHashes(nil, toks, 64, seed)
		for _, p := range []*promptHasher{p, small} {
			got := p.local(&rq, plen)
			if len(toks) != plen || len(got) != len(want) {
				t.Fatalf("%v: %d hashes for %d tokens, want %d", rq.HashIDs, len(got), plen, len(want))
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("%v (chunks of 2^%d): block %d hash %x, want %x", rq.HashIDs, p.cbits, i, got[i], want[i])
				}
			}
		}
		got := p.local(&rq, plen)
		tail := p.appendTail(nil, &rq, len(got)*64, plen)
		if !slicesEqual(tail, toks[len(got)*64:]) {
			t.Fatalf("%v: tail %v, want %v", rq.HashIDs, tail, toks[len(got)*64:])
		}
	}
}

// TestHasherReuse: a workload keeps its prompt hasher between runs; runs on
// a warm workload, sequential or concurrent, report exactly what runs on a
// fresh one do.
func TestHasherReuse(t *testing.T) {
	wl := loadSlice(t)
	fresh := func() *Workload {
		return &Workload{TraceBlockSize: wl.TraceBlockSize, Requests: wl.Requests}
	}
	cfg := Config{Mode: string(router.ModeKV), Workers: 4, Seed: 3}
	want := run(t, fresh(), cfg)
	run(t, wl, cfg)
	if h := wl.hashers[[2]int{wl.TraceBlockSize, sim.DefaultBlockSize}]; h == nil || h.n == 0 {
		t.Fatal("the workload kept no prompt hasher after a run")
	}
	got := make([]*Result, 4)
	errs := make(chan error, len(got))
	for i := range got {
		go func() {
			var err error
			got[i], err = Run(context.Background(), wl, cfg)
			errs <- err
		}()
	}
	for range got {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for i, r := range got {
		if r.Hit != want.Hit || r.TTFT != want.TTFT || r.E2E != want.E2E || r.Passes != want.Passes || r.IndexEvents != want.IndexEvents {
			t.Fatalf("warm run %d: hit %+v TTFT %+v, fresh: hit %+v TTFT %+v", i, r.Hit, r.TTFT, want.Hit, want.TTFT)
		}
	}
}

// The twin's modes are the router's own plus kv+hints; names parse in any
// case to their canonical spelling.
func TestParseMode(t *testing.T) {
	for in, want := range map[string]struct {
		name  string
		mode  router.Mode
		hints bool
	}{
		"KV+Hints":     {ModeKVHints, router.ModeKV, true},
		" round-robin": {"round-robin", router.ModeRoundRobin, false},
		"kv-approx":    {"kv-approx", router.ModeKVApprox, false},
	} {
		name, mode, hints, err := ParseMode(in)
		if err != nil || name != want.name || mode != want.mode || hints != want.hints {
			t.Errorf("ParseMode(%q) = %q %q %v %v", in, name, mode, hints, err)
		}
	}
	if _, _, _, err := ParseMode("kv+approx"); err == nil || err.Error() != `unknown twin mode "kv+approx" (want round-robin, random, kv, kv-approx, kv+hints)` {
		t.Errorf("bad mode: %v", err)
	}
}
