package twin

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/tracefile"
)

func pdWorkload(t *testing.T, reqs ...tracefile.Request) *Workload {
	t.Helper()
	for i := range reqs {
		reqs[i].Line = i + 1
	}
	wl, err := NewWorkload(reqs, nil, 512)
	if err != nil {
		t.Fatal(err)
	}
	return wl
}

func checkPD(t *testing.T, r *Result) {
	t.Helper()
	checkResult(t, r)
	p := r.Paths
	if p == nil {
		t.Fatalf("%s: P/D run without path stats", r.Mode)
	}
	if r.Rejected == 0 && p.Aggregated+p.Disagg+p.LocalPrefill != r.Requests {
		t.Fatalf("%s: %d aggregated + %d disagg + %d local of %d requests", r.Mode, p.Aggregated, p.Disagg, p.LocalPrefill, r.Requests)
	}
	if (p.Aggregated > 0) != (r.Workers > 0) {
		t.Fatalf("%s: %d aggregated requests on %d aggregated workers", r.Mode, p.Aggregated, r.Workers)
	}
	if p.LocalISL+p.LocalPrefillBusy != p.LocalPrefill || p.Handoffs != p.Disagg-p.PrefillOnly || p.PullFailures != 0 || p.RecomputedToks < 0 {
		t.Fatalf("%s: paths %+v", r.Mode, p)
	}
	if p.PayloadBytes != p.HandoffBlocks*sim.DefaultLayers*sim.DefaultPayloadSize || (p.HandoffBlocks > 0 && p.HandoffBytes%(p.HandoffBlocks*DefaultKVBytesPerToken) != 0) {
		t.Fatalf("%s: handoff bytes %+v", r.Mode, p)
	}
}

// The prefill-first flow on hand-made requests: a cold long prompt
// disaggregates and its decode leg pulls every full block; its follow-up,
// whose net new part is short, prefills on the decode worker that now holds
// the prefix; a one-token request ends on the prefill token; a short cold
// prompt still disaggregates (its net new part is all of it). The cold
// request's TTFT is exactly prefill pass + handoff + the decode worker's
// first pass, with hints too (their decode cores price hint fetches
// in-pass, never a handoff's modelled pull).
func TestPDPaths(t *testing.T) {
	wl := pdWorkload(t,
		tracefile.Request{TimestampMS: 0, InputLength: 4096, OutputLength: 10, HashIDs: ids(1, 8)},
		tracefile.Request{TimestampMS: 2000, InputLength: 4352, OutputLength: 10, HashIDs: ids(1, 9)},
		tracefile.Request{TimestampMS: 4000, InputLength: 1024, OutputLength: 1, HashIDs: ids(100, 2)},
		tracefile.Request{TimestampMS: 6000, InputLength: 100, OutputLength: 5, HashIDs: ids(200, 1)},
	)
	for _, c := range []struct {
		mode string
		bw   float64
	}{{string(router.ModeKV), 0}, {string(router.ModeKV), -1}, {ModeKVHints, 0}} {
		bw := c.bw
		r := run(t, wl, Config{Mode: c.mode, PrefillWorkers: 2, DecodeWorkers: 2, TransferBandwidth: bw})
		checkPD(t, r)
		p := r.Paths
		if r.Requests != 4 || p.Disagg != 3 || p.LocalPrefill != 1 || p.LocalISL != 1 || p.PrefillOnly != 1 || p.Handoffs != 2 {
			t.Fatalf("bandwidth %g: paths %+v", bw, p)
		}
		// 4096/64 blocks of the first prompt, 1 full block of the last.
		if p.HandoffBlocks != 65 || p.HeldBlocks != 0 || p.PinnedPeak != 64 || p.Recomputes != 0 {
			t.Fatalf("bandwidth %g: handoffs %+v", bw, p)
		}
		xfer := 64 * 64 * float64(DefaultKVBytesPerToken) / sim.DefaultBandwidth * 1e3
		if bw < 0 {
			xfer = 0
		}
		total := float64(sim.DefaultBlocks * sim.DefaultBlockSize)
		pass := func(prefill, kvTokens int) float64 {
			return sim.PrefillMS(prefill) + sim.Polynomial{}.DecodeMS(kvTokens, int(total))
		}
		// The decode worker recomputes the prompt's last block (it holds
		// every full block but must compute at least one token).
		want := pass(4096, 4096) + xfer + pass(64, 4096)
		if got := r.TTFTSamples[0]; math.Abs(got-want) > 1e-3 {
			t.Fatalf("bandwidth %g: cold request TTFT %.4f ms, want prefill + %.3f ms handoff + decode pass = %.4f", bw, got, xfer, want)
		}
		if bw == 0 && math.Abs(p.HandoffP99MS-xfer) > 1e-6 {
			t.Fatalf("handoff p99 %v, want %v", p.HandoffP99MS, xfer)
		}
		// The follow-up's hit is the decode worker's copy of the prefix.
		if r.Hit.DeviceTokens != 4096 {
			t.Fatalf("bandwidth %g: hit %+v", bw, r.Hit)
		}
	}
}

// When every prefill worker is past the busy threshold the request
// prefills on a decode worker.
func TestPDPrefillBusy(t *testing.T) {
	var reqs []tracefile.Request
	for i := range 3 {
		reqs = append(reqs, tracefile.Request{InputLength: 4096, OutputLength: 4, HashIDs: ids(uint64(100*i+1), 8)})
	}
	wl := pdWorkload(t, reqs...)
	// Two decode workers: the local prefill makes one busy, and decode
	// legs (never charged as prefill) go to the other.
	r := run(t, wl, Config{Mode: string(router.ModeKV), PrefillWorkers: 2, DecodeWorkers: 2, MaxPrefillTokens: 1000})
	checkPD(t, r)
	if p := r.Paths; r.Rejected != 0 || p.Disagg != 2 || p.LocalPrefillBusy != 1 || p.LocalISL != 0 || p.Handoffs != 2 {
		t.Fatalf("%d rejected, paths %+v", r.Rejected, p)
	}
}

// Every mode runs P/D on the trace slice with its invariants, hints are
// fetched on prefill legs only without errors, and equal seeds give equal
// reports.
func TestPDTraceSlice(t *testing.T) {
	wl := loadSlice(t)
	for _, m := range Modes {
		r := run(t, wl, Config{Mode: m, PrefillWorkers: 4, DecodeWorkers: 2, Seed: 5})
		checkPD(t, r)
		if r.Paths.Handoffs == 0 {
			t.Fatalf("%s: no handoffs: %+v", m, r.Paths)
		}
		if m == ModeKVHints && r.Hints.FetchedBlocks == 0 {
			t.Fatalf("kv+hints P/D fetched nothing: %+v", r.Hints)
		}
	}
	a := run(t, wl, Config{Mode: ModeKVHints, PrefillWorkers: 1, DecodeWorkers: 3, Seed: 9})
	b := run(t, wl, Config{Mode: ModeKVHints, PrefillWorkers: 1, DecodeWorkers: 3, Seed: 9})
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if !bytes.Equal(ja, jb) {
		t.Fatal("equal seeds gave different P/D reports")
	}
	var buf bytes.Buffer
	if err := a.WriteSummary(&buf); err != nil {
		t.Fatal(err)
	}
	if s := buf.String(); !strings.Contains(s, "1 prefill + 3 decode workers") || !strings.Contains(s, "handoffs") ||
		!strings.HasPrefix(a.LastLine(), "twin: mode=kv+hints fleet=1P+3D requests=300 ") {
		t.Fatalf("summary:\n%s", s)
	}
}

// Item 6 of the issue: prefill tokens in a pass slow its decode tokens, so
// taking prefills off the decode workers steadies inter-token latency.
func TestPDSteadierITL(t *testing.T) {
	wl := loadSlice(t)
	agg := run(t, wl, Config{Mode: string(router.ModeKV), Workers: 4, ArrivalSpeedup: 4})
	pd := run(t, wl, Config{Mode: string(router.ModeKV), PrefillWorkers: 2, DecodeWorkers: 2, ArrivalSpeedup: 4})
	if !(pd.ITL.P99 < agg.ITL.P99) || !(pd.ITL.Max < agg.ITL.Max) {
		t.Fatalf("ITL p99/max: aggregated %.2f/%.2f ms, 2P+2D %.2f/%.2f ms", agg.ITL.P99, agg.ITL.Max, pd.ITL.P99, pd.ITL.Max)
	}
	t.Logf("ITL p99/max: aggregated %.2f/%.2f ms, 2P+2D %.2f/%.2f ms", agg.ITL.P99, agg.ITL.Max, pd.ITL.P99, pd.ITL.Max)
}

func TestPDConfig(t *testing.T) {
	for _, c := range []Config{
		{Mode: "kv", PrefillWorkers: 2},
		{Mode: "kv", DecodeWorkers: 2},
		{Mode: "kv", PrefillWorkers: 1, DecodeWorkers: 1, LocalPrefillRatio: 1.5},
		{Mode: "kv", PrefillWorkers: -1, DecodeWorkers: 1},
	} {
		if _, err := c.Normalize(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	c, err := Config{Mode: "kv", PrefillWorkers: 1, DecodeWorkers: 1}.Normalize()
	if err != nil || c.Workers != 0 || c.LocalPrefillTokens != router.DefaultLocalPrefillTokens || c.LocalPrefillRatio != router.DefaultLocalPrefillRatio {
		t.Fatalf("%+v %v", c, err)
	}
	// Without P/D the thresholds are cleared, so reports stay as they were.
	if c, _ := (Config{Mode: "kv", LocalPrefillTokens: 5}).Normalize(); c.LocalPrefillTokens != 0 || c.Workers != DefaultWorkers {
		t.Fatalf("%+v", c)
	}
}

// A decode worker with no room for the handoff's blocks keeps what fits
// (here: the pull's tail evicts its head) and recomputes the rest; the
// request still completes.
func TestPDShortPullRecomputes(t *testing.T) {
	wl := pdWorkload(t,
		tracefile.Request{TimestampMS: 0, InputLength: 4096, OutputLength: 200, HashIDs: ids(1, 8)},
		tracefile.Request{TimestampMS: 300, InputLength: 3072, OutputLength: 10, HashIDs: ids(50, 6)},
	)
	r := run(t, wl, Config{Mode: string(router.ModeKV), PrefillWorkers: 1, DecodeWorkers: 1, Blocks: 100})
	checkResult(t, r)
	p := r.Paths
	if r.Requests != 2 || p.Handoffs != 2 || p.Recomputes != 1 || p.RecomputedToks <= 0 {
		t.Fatalf("%d requests, paths %+v", r.Requests, p)
	}
}

// A closed loop issues the next request when one ends on either leg, a
// mixed fleet serves some requests whole on its aggregated pool, and
// engine blocks that straddle trace blocks (no prompt hasher) hash the
// prompt for both legs.
func TestPDClosedLoopAndUnalignedBlocks(t *testing.T) {
	wl, err := NewWorkload(loadSlice(t).Requests[:100], nil, 512)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []Config{
		{Mode: string(router.ModeKV), PrefillWorkers: 1, DecodeWorkers: 2, Concurrency: 4},
		{Mode: ModeKVHints, Workers: 2, PrefillWorkers: 1, DecodeWorkers: 1}, // mixed
		{Mode: ModeKVHints, PrefillWorkers: 2, DecodeWorkers: 1, BlockSize: 48},
	} {
		r := run(t, wl, c)
		checkPD(t, r)
		if r.Requests != 100 || r.Paths.Handoffs == 0 {
			t.Fatalf("%+v: %d requests, paths %+v", c, r.Requests, r.Paths)
		}
	}
}
