package twin

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/kvmesh/kvmesh/plot"
)

// DefaultLadderSLOMS is the p90 TTFT a ladder step must stay under (ms)
// to count as within capacity.
const DefaultLadderSLOMS = 1000

// Ladder file names inside the output directory.
const (
	LadderTTFTSVG = "ladder_ttft.svg"
	LadderHitSVG  = "ladder_hit.svg"
)

// Ladder is one replay of a trace per arrival speedup and mode: the
// capacity each routing mode reaches before its p90 TTFT passes the SLO.
type Ladder struct {
	Speedups []float64
	Modes    []string
	// Results[i][j] is speedup i in mode j.
	Results [][]*Result
	SLOMS   float64
}

// ParseLadder parses a comma-separated list of arrival speedups, each a
// finite number > 0, listed once; they are returned in ascending order.
func ParseLadder(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(v > 0) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("speedup %q: want a finite number > 0", strings.TrimSpace(f))
		}
		if slices.Contains(out, v) {
			return nil, fmt.Errorf("speedup %g listed twice", v)
		}
		out = append(out, v)
	}
	slices.Sort(out)
	return out, nil
}

// RunLadder replays wl once per speedup and mode in open loop (base's
// ArrivalSpeedup and Mode are replaced; its Concurrency must be 0).
// progress, if not nil, hears each run's last line as it ends.
func RunLadder(ctx context.Context, wl *Workload, base Config, modes []string, speedups []float64, sloMS float64, progress io.Writer) (*Ladder, error) {
	if base.Concurrency != 0 {
		return nil, fmt.Errorf("twin: a ladder steps the open loop's arrival speedup; it cannot run a closed loop (concurrency %d)", base.Concurrency)
	}
	if len(speedups) == 0 || len(modes) == 0 {
		return nil, fmt.Errorf("twin: a ladder needs at least one speedup and one mode")
	}
	l := &Ladder{Speedups: speedups, Modes: modes, SLOMS: sloMS}
	for _, sp := range speedups {
		row := make([]*Result, 0, len(modes))
		for _, m := range modes {
			c := base
			c.Mode, c.ArrivalSpeedup = m, sp
			res, err := Run(ctx, wl, c)
			if err != nil {
				return nil, fmt.Errorf("twin: ladder speedup %g mode %s: %w", sp, m, err)
			}
			if progress != nil {
				fmt.Fprintf(progress, "twin: speedup=%g %s\n", sp, res.LastLine())
			}
			row = append(row, res)
		}
		l.Results = append(l.Results, row)
	}
	return l, nil
}

// withinSLO reports whether a step served requests with p90 TTFT under
// the SLO; a step that completed none is not within it.
func (l *Ladder) withinSLO(r *Result) bool {
	return r.Requests > 0 && r.TTFT.P90 <= l.SLOMS
}

// MaxSpeedup is the highest speedup at which mode j's p90 TTFT stays
// within the SLO, or 0 when none does.
func (l *Ladder) MaxSpeedup(j int) float64 {
	var best float64
	for i, sp := range l.Speedups {
		if l.withinSLO(l.Results[i][j]) {
			best = sp
		}
	}
	return best
}

// WriteTable prints one row per speedup and mode, then one capacity line
// per mode:
//
//	twin: capacity mode=<m> p90_ttft_le_ms=<slo> max_speedup=<x>
func (l *Ladder) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "speedup\tmode\trequests\trejected\thit\treachable\tttft p50\tttft p90\tttft p99\tttft mean\tqueue wait mean\treq/s\tpreemptions\t")
	for i, sp := range l.Speedups {
		for _, r := range l.Results[i] {
			wait := "-" // no router queue
			if r.Queue != nil {
				wait = strconv.FormatFloat(r.Queue.Wait.Mean, 'f', 1, 64)
			}
			fmt.Fprintf(tw, "%g\t%s\t%d\t%d\t%.4f\t%.4f\t%.1f\t%.1f\t%.1f\t%.1f\t%s\t%.3f\t%d\t\n",
				sp, r.Mode, r.Requests, r.Rejected, r.Hit.Total, r.Reachable, r.TTFT.P50, r.TTFT.P90, r.TTFT.P99, r.TTFT.Mean, wait, r.ReqPerS, r.Preemptions)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for j, m := range l.Modes {
		if _, err := fmt.Fprintf(w, "twin: capacity mode=%s p90_ttft_le_ms=%g max_speedup=%g\n", m, l.SLOMS, l.MaxSpeedup(j)); err != nil {
			return err
		}
	}
	return nil
}

// WriteCharts writes p90 TTFT (log scale) against the speedup, a line per
// mode, and the hit ratio, a hit and a reachable line per mode, into dir,
// and returns the paths written.
func (l *Ladder) WriteCharts(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("twin: %w", err)
	}
	var ttft, hit []plot.Series
	for j, m := range l.Modes {
		p90 := plot.Series{Name: m}
		h, reach := plot.Series{Name: m + " hit"}, plot.Series{Name: m + " reachable"}
		for i, sp := range l.Speedups {
			r := l.Results[i][j]
			if r.Requests > 0 {
				p90.X, p90.Y = append(p90.X, sp), append(p90.Y, r.TTFT.P90)
			}
			h.X, h.Y = append(h.X, sp), append(h.Y, r.Hit.Total)
			reach.X, reach.Y = append(reach.X, sp), append(reach.Y, r.Reachable)
		}
		ttft = append(ttft, p90)
		hit = append(hit, h, reach)
	}
	tc := &plot.LineChart{Title: fmt.Sprintf("p90 TTFT by arrival speedup (SLO %g ms)", l.SLOMS), XLabel: "arrival speedup (×)",
		YLabel: "p90 TTFT (ms, log scale)", Series: ttft, Style: plot.LinesPoints, LogY: true}
	hc := &plot.LineChart{Title: "Prefix hit ratio by arrival speedup (achieved and reachable)", XLabel: "arrival speedup (×)",
		YLabel: "fraction of prompt tokens", Series: hit, Style: plot.LinesPoints, Y: plot.Range{Min: 0, Max: 1}}
	var paths []string
	for _, c := range []struct {
		name  string
		chart plot.Chart
	}{{LadderTTFTSVG, tc}, {LadderHitSVG, hc}} {
		p := filepath.Join(dir, c.name)
		if err := plot.WriteFile(p, c.chart); err != nil {
			return nil, fmt.Errorf("twin: %w", err)
		}
		paths = append(paths, p)
	}
	return paths, nil
}
