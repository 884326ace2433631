package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvmesh/kvmesh/internal/stages"
)

// The online capacity ladder (`bench load --ladder`): the trace replayed
// against a running server once per arrival speedup, in ascending order,
// each step with its own Salt so it meets a cache cold for its prompts (as
// each of the twin's replays starts a fresh fleet). Its table is the
// twin's ladder table for one mode, the server's; the server's own
// figures (reachable prefix, router queue wait) come from what its
// /metrics moved by during the step.

// LadderStep is one speedup's run.
type LadderStep struct {
	Speedup float64
	Report  *LoadReport
	Server  ServerDelta
}

// ServerDelta is what a kvmesh server's /metrics moved by during a step;
// OK is false when they could not be read (not a kvmesh server, or no
// access).
type ServerDelta struct {
	OK bool
	// ISLTokens: prompt tokens routed; Reachable and Routed: the prefix
	// tokens the best eligible and the chosen workers held.
	ISLTokens, Reachable, Routed float64
	// QueueWaits and QueueWaitS: requests that waited in the router
	// queue, and their wait (s) in all.
	QueueWaits, QueueWaitS float64
}

// LoadLadder is a ladder's steps.
type LoadLadder struct {
	Label string // the mode column: what the server runs
	SLOMS float64
	Steps []LadderStep
}

// RunLoadLadder runs c once per speedup (ascending; c.Speedup, c.Salt and
// c.OutDir are set per step: the step's outputs go to OutDir/speedup-S).
// progress hears each step's last line. A step cut short by ctx ends the
// ladder with the steps done so far.
func RunLoadLadder(ctx context.Context, c LoadConfig, speedups []float64, label string, sloMS float64, progress io.Writer) (*LoadLadder, error) {
	if c.TracePath == "" || c.Synthetic != nil || c.Rate > 0 || c.Concurrency > 0 {
		return nil, fmt.Errorf("bench load: a ladder steps a trace replay's speedup: it needs --trace and neither --rate nor --concurrency")
	}
	if progress == nil {
		progress = io.Discard
	}
	client := c.Client
	if client == nil {
		tr := &http.Transport{Proxy: http.ProxyFromEnvironment}
		defer tr.CloseIdleConnections()
		client = &http.Client{Transport: tr}
	}
	l := &LoadLadder{Label: label, SLOMS: sloMS}
	for i, sp := range speedups {
		sc := c
		sc.Speedup, sc.Salt = sp, c.Salt+uint64(i)+1
		if c.OutDir != "" {
			sc.OutDir = filepath.Join(c.OutDir, "speedup-"+strconv.FormatFloat(sp, 'g', -1, 64))
		}
		before, berr := scrapeFamilies(ctx, client, &c)
		rep, err := RunLoad(ctx, sc, io.Discard)
		if err != nil {
			return nil, fmt.Errorf("ladder speedup %g: %w", sp, err)
		}
		step := LadderStep{Speedup: sp, Report: rep}
		if berr == nil {
			if after, err := scrapeFamilies(context.WithoutCancel(ctx), client, &c); err == nil {
				step.Server = serverDelta(before, after)
			}
		}
		l.Steps = append(l.Steps, step)
		fmt.Fprintf(progress, "load: speedup=%g %s\n", sp, strings.TrimPrefix(rep.SummaryLine(), "load: "))
		if rep.Interrupted != "" {
			break
		}
	}
	return l, nil
}

func scrapeFamilies(ctx context.Context, client *http.Client, c *LoadConfig) (map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return stages.Families(ctx, client, metricsURL(c.URL), c.APIKey)
}

// serverDelta is after − before of the series a ladder reports.
func serverDelta(before, after map[string]*dto.MetricFamily) ServerDelta {
	// total sums a family's series whose labels include kind (any when
	// empty): counters' values, histograms' sums (or counts).
	total := func(fams map[string]*dto.MetricFamily, name, kind string, count bool) float64 {
		var v float64
		for _, m := range fams[name].GetMetric() {
			if kind != "" && !hasLabel(m, "kind", kind) {
				continue
			}
			switch {
			case m.Histogram != nil && count:
				v += float64(m.GetHistogram().GetSampleCount())
			case m.Histogram != nil:
				v += m.GetHistogram().GetSampleSum()
			default:
				v += m.GetCounter().GetValue()
			}
		}
		return v
	}
	d := func(name, kind string, count bool) float64 {
		return total(after, name, kind, count) - total(before, name, kind, count)
	}
	return ServerDelta{OK: after["kvmesh_router_isl_tokens_total"] != nil,
		ISLTokens:  d("kvmesh_router_isl_tokens_total", "", false),
		Reachable:  d("kvmesh_router_prefix_tokens_total", "reachable", false),
		Routed:     d("kvmesh_router_prefix_tokens_total", "routed", false),
		QueueWaits: d("kvmesh_router_queue_seconds", "", true),
		QueueWaitS: d("kvmesh_router_queue_seconds", "", false),
	}
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue() == value
		}
	}
	return false
}

// MaxSpeedup is the highest speedup whose p90 TTFT stayed within the SLO
// with every request served, or 0 when none did.
func (l *LoadLadder) MaxSpeedup() float64 {
	var best float64
	for _, s := range l.Steps {
		r := s.Report
		if r.OK > 0 && r.OK == r.Requests && r.TTFTms.P90 <= l.SLOMS {
			best = s.Speedup
		}
	}
	return best
}

// WriteTable prints the twin's ladder table for the server's mode (hit:
// the server's usage.cached_tokens over prompt tokens; reachable: the
// server's reachable prefix over its routed prompt tokens; queue wait: its
// router queue's mean wait over every request, "-" without a queue;
// preemptions are not measured online), then the capacity line
//
//	load: capacity mode=<label> p90_ttft_le_ms=<slo> max_speedup=<x>
func (l *LoadLadder) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "speedup\tmode\trequests\trejected\thit\treachable\tttft p50\tttft p90\tttft p99\tttft mean\tqueue wait mean\treq/s\tpreemptions\t")
	for _, s := range l.Steps {
		r, sd := s.Report, s.Server
		reach, wait := "-", "-"
		if sd.OK && sd.ISLTokens > 0 {
			reach = strconv.FormatFloat(sd.Reachable/sd.ISLTokens, 'f', 4, 64)
		}
		if sd.OK && sd.QueueWaits > 0 && r.OK > 0 {
			// Over every served request, as the twin's mean (0 for
			// those that did not wait).
			wait = strconv.FormatFloat(1000*sd.QueueWaitS/float64(max(r.OK, int(sd.QueueWaits))), 'f', 1, 64)
		}
		fmt.Fprintf(tw, "%g\t%s\t%d\t%d\t%.4f\t%s\t%.1f\t%.1f\t%.1f\t%.1f\t%s\t%.3f\t-\t\n",
			s.Speedup, l.Label, r.OK, r.Requests-r.OK, r.CachedRatio, reach, r.TTFTms.P50, r.TTFTms.P90, r.TTFTms.P99, r.TTFTms.Mean, wait, r.RequestsPerS)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "load: capacity mode=%s p90_ttft_le_ms=%g max_speedup=%g\n", l.Label, l.SLOMS, l.MaxSpeedup())
	return err
}
