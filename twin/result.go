package twin

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvmesh/kvmesh/internal/quantile"
	"github.com/kvmesh/kvmesh/plot"
	"github.com/kvmesh/kvmesh/router"
)

// Result is one mode's measurements. Latencies follow aiperf's definitions:
// TTFT = first token − arrival, E2E = last token − arrival, ITL per request
// = (E2E − TTFT)/(output tokens − 1); throughput is over the span from the
// first arrival to the last completion.
type Result struct {
	// refusedSkips counts the routings of refused requests the router
	// queue skipped, their answer unchanged (twin.mayAdmit); for tests.
	refusedSkips int

	Mode    string `json:"mode"`
	Workers int    `json:"workers"` // aggregated
	// PrefillWorkers and DecodeWorkers are the P/D pools (0 without P/D).
	PrefillWorkers int `json:"prefill_workers,omitempty"`
	DecodeWorkers  int `json:"decode_workers,omitempty"`
	Offered        int `json:"offered"`  // trace requests issued
	Requests       int `json:"requests"` // completed
	Rejected       int `json:"rejected"`
	// RejectedBusy: every worker past a router busy threshold (a 503);
	// RejectedInvalid: the engine refused the request (empty, too long).
	RejectedBusy    int      `json:"rejected_busy"`
	RejectedInvalid int      `json:"rejected_invalid"`
	RejectReasons   []string `json:"reject_reasons,omitempty"` // the first few

	TTFT Dist `json:"ttft_ms"`
	ITL  Dist `json:"itl_ms"`
	E2E  Dist `json:"e2e_ms"`

	SimSeconds    float64 `json:"sim_s"` // virtual span: first arrival to last completion
	OutputTokens  int64   `json:"output_tokens"`
	OutputTokPerS float64 `json:"output_tok_per_s"`
	ReqPerS       float64 `json:"req_per_s"`

	Hit HitSplit `json:"hit"`
	// Reachable is the hit ratio had every request gone to the eligible
	// worker holding its longest prefix (Decision.ReachableTokens, any
	// tier, as the router's index saw it); its gap to Hit is the routing's
	// regret. Round-robin and random measure it against an index too.
	Reachable float64 `json:"reachable"`
	// PredictedHit is the prefix the router expected the chosen workers to
	// hold (Decision.CachedTokens) over all prompt tokens; kv-approx's gap
	// to Hit.Device is its index's error.
	PredictedHit float64 `json:"predicted_hit"`

	Hints HintStats `json:"hints"`
	// KVBM is the block managers' totals (Config.KVBM).
	KVBM *KVBMResult `json:"kvbm,omitempty"`
	// Queue is what the router queue did (Config.Queue; nil without).
	Queue *QueueStats `json:"queue,omitempty"`
	// Paths counts requests by path and measures handoffs (P/D runs only).
	Paths *PathStats `json:"paths,omitempty"`

	Passes        int64  `json:"passes"`
	Preemptions   int64  `json:"preemptions"`
	EvictedBlocks int64  `json:"evicted_blocks"`
	FetchErrors   int64  `json:"fetch_errors"`
	IndexEvents   uint64 `json:"index_events"` // KV events applied to the router's index

	// Wall is this mode's simulation time on the host; it is kept out of
	// the JSON so equal seeds give byte-identical reports.
	Wall time.Duration `json:"-"`
	// CPU is the process CPU time over the same span (GC included; 0 where
	// the platform does not report it): the figure to trust on a shared host.
	CPU time.Duration `json:"-"`
	// IndexOffLoop is the share of KV events the index applied on its own
	// goroutine rather than the event loop's (feed.go); it depends on the
	// host's scheduling, so it stays out of the JSON too.
	IndexOffLoop float64 `json:"-"`
	// TTFTSamples are the completed requests' TTFTs (ms) in completion order.
	TTFTSamples []float64 `json:"-"`
	// ITLSamples are their ITLs (ms, requests of two or more tokens), for
	// the ITL chart of reports with P/D.
	ITLSamples []float64 `json:"-"`
}

// Fleet names the run's fleet: "8 agg", or "4P+4D" with P/D.
func (r *Result) Fleet() string {
	switch {
	case r.Paths == nil:
		return fmt.Sprintf("%d agg", r.Workers)
	case r.Workers > 0:
		return fmt.Sprintf("%dA+%dP+%dD", r.Workers, r.PrefillWorkers, r.DecodeWorkers)
	}
	return fmt.Sprintf("%dP+%dD", r.PrefillWorkers, r.DecodeWorkers)
}

// label names a result in charts: its mode, prefixed by its fleet when the
// report compares P/D fleets.
func (r *Result) label(pd bool) string {
	if !pd {
		return r.Mode
	}
	return r.Fleet() + " " + r.Mode
}

// anyPD reports whether some result ran P/D.
func anyPD(rs []*Result) bool {
	for _, r := range rs {
		if r.Paths != nil {
			return true
		}
	}
	return false
}

// Dist summarises samples (ms).
type Dist struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
}

// newDist uses nearest-rank percentiles.
func newDist(xs []float64) Dist {
	if len(xs) == 0 {
		return Dist{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	var sum float64
	for _, v := range s {
		sum += v
	}
	q := func(p float64) float64 { return quantile.Nearest(s, p) }
	return Dist{N: len(s), Mean: sum / float64(len(s)), P50: q(0.50), P90: q(0.90), P99: q(0.99), Max: s[len(s)-1]}
}

// HitSplit is where the completed requests' prompt tokens came from: hit =
// not recomputed = device + fetched from peers + host + disk. Host and disk
// stay 0 until the twin has KVBM tiers.
type HitSplit struct {
	Total        float64 `json:"total"`
	Device       float64 `json:"device"`
	Peers        float64 `json:"peers"`
	Host         float64 `json:"host"`
	Disk         float64 `json:"disk"`
	Object       float64 `json:"object,omitempty"`
	PromptTokens int64   `json:"prompt_tokens"`
	DeviceTokens int64   `json:"device_tokens"`
	PeerTokens   int64   `json:"peer_tokens"`
	HostTokens   int64   `json:"host_tokens"`
	DiskTokens   int64   `json:"disk_tokens"`
	ObjectTokens int64   `json:"object_tokens,omitempty"`
}

// HintStats counts kv+hints work.
type HintStats struct {
	Hints         int   `json:"hints"`          // decisions that carried a hint
	PlannedBlocks int64 `json:"planned_blocks"` // blocks hinted beyond the target's prefix
	FetchedBlocks int64 `json:"fetched_blocks"` // blocks copied from peers
	ModelledBytes int64 `json:"modelled_bytes"` // FetchedBlocks × modelled block size
	PayloadBytes  int64 `json:"payload_bytes"`  // sim payload bytes copied and verified
	Misses        int   `json:"misses"`         // hints that found nothing left to fetch
	Errors        int   `json:"errors"`
}

// LastLine is the one-line summary every mode's output ends with.
func (r *Result) LastLine() string {
	if r.Paths != nil {
		return fmt.Sprintf("twin: mode=%s fleet=%s requests=%d disagg=%d local_prefill=%d hit=%.4f reachable=%.4f ttft_p50_ms=%.1f ttft_mean_ms=%.1f itl_p99_ms=%.2f wall_s=%.3f",
			r.Mode, r.Fleet(), r.Requests, r.Paths.Disagg, r.Paths.LocalPrefill, r.Hit.Total, r.Reachable, r.TTFT.P50, r.TTFT.Mean, r.ITL.P99, r.Wall.Seconds())
	}
	if q := r.Queue; q != nil {
		return fmt.Sprintf("twin: mode=%s requests=%d hit=%.4f reachable=%.4f ttft_p50_ms=%.1f ttft_mean_ms=%.1f queue_wait_mean_ms=%.1f wall_s=%.3f",
			r.Mode, r.Requests, r.Hit.Total, r.Reachable, r.TTFT.P50, r.TTFT.Mean, q.Wait.Mean, r.Wall.Seconds())
	}
	return fmt.Sprintf("twin: mode=%s requests=%d hit=%.4f reachable=%.4f ttft_p50_ms=%.1f ttft_mean_ms=%.1f wall_s=%.3f",
		r.Mode, r.Requests, r.Hit.Total, r.Reachable, r.TTFT.P50, r.TTFT.Mean, r.Wall.Seconds())
}

// WriteSummary prints a mode's measurements, ending with LastLine.
func (r *Result) WriteSummary(w io.Writer) error {
	var b strings.Builder
	fleet := fmt.Sprintf("%d workers", r.Workers)
	if r.Paths != nil {
		fleet = fmt.Sprintf("%d prefill + %d decode workers", r.PrefillWorkers, r.DecodeWorkers)
		if r.Workers > 0 {
			fleet = fmt.Sprintf("%d aggregated + ", r.Workers) + fleet
		}
	}
	fmt.Fprintf(&b, "mode %s: %s, %d/%d requests completed, %d rejected (%d busy, %d invalid), %.1f s simulated, %d passes, %d preemptions\n",
		r.Mode, fleet, r.Requests, r.Offered, r.Rejected, r.RejectedBusy, r.RejectedInvalid, r.SimSeconds, r.Passes, r.Preemptions)
	for _, why := range r.RejectReasons {
		fmt.Fprintf(&b, "  rejected: %s\n", why)
	}
	for _, d := range []struct {
		name string
		d    Dist
	}{{"TTFT", r.TTFT}, {"ITL", r.ITL}, {"E2E", r.E2E}} {
		fmt.Fprintf(&b, "  %-4s ms  p50 %9.1f  p90 %9.1f  p99 %9.1f  mean %9.1f  max %9.1f\n", d.name, d.d.P50, d.d.P90, d.d.P99, d.d.Mean, d.d.Max)
	}
	fmt.Fprintf(&b, "  throughput  %.1f output tok/s, %.3f req/s\n", r.OutputTokPerS, r.ReqPerS)
	fmt.Fprintf(&b, "  host        %.3f s wall, %.3f s CPU; %d KV events indexed, %d blocks evicted\n", r.Wall.Seconds(), r.CPU.Seconds(), r.IndexEvents, r.EvictedBlocks)
	h := r.Hit
	note := " (host/disk: workers run no KVBM tier; see --connector kvbm)"
	if r.KVBM != nil {
		note = ""
	}
	if h.ObjectTokens > 0 {
		note = fmt.Sprintf(" + object %.4f", h.Object)
	}
	fmt.Fprintf(&b, "  prefix hit  %.4f = device %.4f + peers %.4f + host %.4f + disk %.4f%s; router predicted %.4f\n",
		h.Total, h.Device, h.Peers, h.Host, h.Disk, note, r.PredictedHit)
	b.WriteString(r.kvbmLine())
	if r.Mode == ModeKVHints {
		hs := r.Hints
		fmt.Fprintf(&b, "  hints       %d hints, %d blocks planned, %d fetched (%.2f GiB modelled, %d payload bytes verified), %d misses, %d errors\n",
			hs.Hints, hs.PlannedBlocks, hs.FetchedBlocks, float64(hs.ModelledBytes)/(1<<30), hs.PayloadBytes, hs.Misses, hs.Errors)
	}
	if q := r.Queue; q != nil {
		fmt.Fprintf(&b, "  queue       %s: %d requests waited (depth up to %d); wait ms  p50 %.1f  p90 %.1f  p99 %.1f  mean %.1f  max %.1f (part of TTFT)\n",
			q.Policy, q.Queued, q.MaxDepth, q.Wait.P50, q.Wait.P90, q.Wait.P99, q.Wait.Mean, q.Wait.Max)
	}
	if p := r.Paths; p != nil {
		fmt.Fprintf(&b, "  paths       %d aggregated, %d disagg (%d ended on the prefill token), %d local prefill (%d %s, %d %s)\n",
			p.Aggregated, p.Disagg, p.PrefillOnly, p.LocalPrefill, p.LocalISL, router.ReasonISL, p.LocalPrefillBusy, router.ReasonPrefillBusy)
		fmt.Fprintf(&b, "  handoffs    %d: %d blocks pulled (%.2f GiB modelled, %d payload bytes verified), %d already held; transfer p50 %.1f ms p99 %.1f ms; %d short pulls, %d decode legs recomputed %d prompt tokens; peak %d prefill blocks pinned\n",
			p.Handoffs, p.HandoffBlocks, float64(p.HandoffBytes)/(1<<30), p.PayloadBytes, p.HeldBlocks, p.HandoffP50MS, p.HandoffP99MS, p.PullFailures, p.Recomputes, p.RecomputedToks, p.PinnedPeak)
	}
	b.WriteString(r.LastLine())
	b.WriteByte('\n')
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteComparison prints the modes side by side (with fleets and paths
// when some result ran P/D).
func WriteComparison(w io.Writer, rs []*Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	if anyPD(rs) {
		fmt.Fprintln(tw, "fleet\tmode\trequests\trejected\thit\tttft p50\tttft p99\titl p50\titl p99\te2e mean\ttok/s\taggregated\tdisagg\tlocal isl\tlocal busy\thandoff GiB\thandoff p50\thandoff p99\twall s\t")
		for _, r := range rs {
			p := r.Paths
			if p == nil {
				p = &PathStats{Aggregated: r.Requests}
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.4f\t%.1f\t%.1f\t%.2f\t%.2f\t%.1f\t%.1f\t%d\t%d\t%d\t%d\t%.2f\t%.1f\t%.1f\t%.3f\t\n",
				r.Fleet(), r.Mode, r.Requests, r.Rejected, r.Hit.Total, r.TTFT.P50, r.TTFT.P99, r.ITL.P50, r.ITL.P99, r.E2E.Mean,
				r.OutputTokPerS, p.Aggregated, p.Disagg, p.LocalISL, p.LocalPrefillBusy, float64(p.HandoffBytes)/(1<<30), p.HandoffP50MS, p.HandoffP99MS, r.Wall.Seconds())
		}
		return tw.Flush()
	}
	fmt.Fprintln(tw, "mode\trequests\trejected\thit\tdevice\tpeers\tttft p50\tttft p90\tttft p99\tttft mean\titl mean\te2e mean\ttok/s\treq/s\thints\tfetched GiB\twall s\t")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.4f\t%.4f\t%.4f\t%.1f\t%.1f\t%.1f\t%.1f\t%.2f\t%.1f\t%.1f\t%.3f\t%d\t%.2f\t%.3f\t\n",
			r.Mode, r.Requests, r.Rejected, r.Hit.Total, r.Hit.Device, r.Hit.Peers,
			r.TTFT.P50, r.TTFT.P90, r.TTFT.P99, r.TTFT.Mean, r.ITL.Mean, r.E2E.Mean,
			r.OutputTokPerS, r.ReqPerS, r.Hints.Hints, float64(r.Hints.ModelledBytes)/(1<<30), r.Wall.Seconds())
	}
	return tw.Flush()
}

// Report is the JSON document WriteReport writes.
type Report struct {
	Trace        string `json:"trace,omitempty"`
	TraceLines   int    `json:"trace_requests"`
	SkippedLines int    `json:"skipped_lines"`
	Config       Config `json:"config"`
	// Fleets is --fleets when several fleets were compared (Config then
	// holds the last one's; each result names its own).
	Fleets  string    `json:"fleets,omitempty"`
	Results []*Result `json:"results"`
}

// Report file names inside the output directory.
const (
	ReportJSON = "twin.json"
	TTFTSVG    = "twin_ttft_cdf.svg"
	HitSVG     = "twin_hit_ratio.svg"
	ITLSVG     = "twin_itl_cdf.svg" // P/D reports only
)

// WriteReport writes rep as JSON plus two SVG charts (the TTFT CDF of every
// mode and the hit ratio split per mode) into dir, creating it, and returns
// the paths written. A report with a P/D run labels each result by fleet
// and mode and adds the ITL CDF.
func WriteReport(dir string, rep Report) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("twin: %w", err)
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("twin: %w", err)
	}
	jpath := filepath.Join(dir, ReportJSON)
	if err := writeFileAtomic(jpath, append(js, '\n')); err != nil {
		return nil, err
	}
	var series, itl []plot.Series
	pd := anyPD(rep.Results)
	cats := make([]string, 0, len(rep.Results))
	dev, peers, total := plot.Bars{Name: "device"}, plot.Bars{Name: "fetched from peers"}, plot.Bars{Name: "total"}
	for _, r := range rep.Results {
		series = append(series, cdfSeries(r.label(pd), r.TTFTSamples, cdfPoints))
		itl = append(itl, cdfSeries(r.label(pd), r.ITLSamples, cdfPoints))
		cats = append(cats, r.label(pd))
		dev.Values = append(dev.Values, r.Hit.Device)
		peers.Values = append(peers.Values, r.Hit.Peers)
		total.Values = append(total.Values, r.Hit.Total)
	}
	cdf := plot.CDFChart("TTFT by routing mode", "TTFT (ms, log scale)", series...)
	cdf.LogX = true
	tpath := filepath.Join(dir, TTFTSVG)
	if err := plot.WriteFile(tpath, cdf); err != nil {
		return nil, fmt.Errorf("twin: %w", err)
	}
	bars := &plot.BarChart{Title: "Prefix hit ratio (prompt tokens not recomputed)", XLabel: "routing mode",
		YLabel: "fraction of prompt tokens", Categories: cats, Series: []plot.Bars{dev, peers, total}, Y: plot.Range{Min: 0, Max: 1}}
	hpath := filepath.Join(dir, HitSVG)
	if err := plot.WriteFile(hpath, bars); err != nil {
		return nil, fmt.Errorf("twin: %w", err)
	}
	if !pd {
		return []string{jpath, tpath, hpath}, nil
	}
	ic := plot.CDFChart("ITL by fleet and mode", "mean inter-token latency per request (ms, log scale)", itl...)
	ic.LogX = true
	ipath := filepath.Join(dir, ITLSVG)
	if err := plot.WriteFile(ipath, ic); err != nil {
		return nil, fmt.Errorf("twin: %w", err)
	}
	return []string{jpath, tpath, hpath, ipath}, nil
}

// cdfPoints bounds the points per CDF series, so a 12k-request run's chart
// stays small.
const cdfPoints = 800

// cdfSeries is plot.CDF thinned to at most max points: the sorted samples
// at evenly spaced ranks, always keeping the first and the last.
func cdfSeries(name string, xs []float64, maxPts int) plot.Series {
	s := plot.CDF(name, xs)
	n := len(s.X)
	if n <= maxPts {
		return s
	}
	out := plot.Series{Name: name, X: make([]float64, 0, maxPts), Y: make([]float64, 0, maxPts)}
	for k := 0; k < maxPts; k++ {
		i := k * (n - 1) / (maxPts - 1)
		out.X = append(out.X, s.X[i])
		out.Y = append(out.Y, s.Y[i])
	}
	return out
}

func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".twin-*")
	if err != nil {
		return fmt.Errorf("twin: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("twin: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("twin: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("twin: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("twin: %w", err)
	}
	return nil
}
