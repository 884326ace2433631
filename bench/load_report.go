package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/kvmesh/kvmesh/internal/quantile"
	"github.com/kvmesh/kvmesh/plot"
)

// SLO is one goodput condition on a request metric.
type SLO struct {
	Metric    string  // ttft_ms, ttst_ms, itl_ms, latency_ms or tps_user
	Op        string  // "<=" or ">="
	Threshold float64 // in the metric's unit
}

func (s SLO) String() string {
	return s.Metric + s.Op + strconv.FormatFloat(s.Threshold, 'g', -1, 64)
}

// sloMetrics maps accepted names (ours and aiperf's) to a canonical metric
// and its natural direction.
var sloMetrics = map[string]struct{ name, op string }{
	"ttft": {"ttft_ms", "<="}, "ttft_ms": {"ttft_ms", "<="}, "time_to_first_token": {"ttft_ms", "<="},
	"ttst": {"ttst_ms", "<="}, "ttst_ms": {"ttst_ms", "<="}, "time_to_second_token": {"ttst_ms", "<="},
	"itl": {"itl_ms", "<="}, "itl_ms": {"itl_ms", "<="}, "inter_token_latency": {"itl_ms", "<="},
	"latency": {"latency_ms", "<="}, "latency_ms": {"latency_ms", "<="}, "request_latency": {"latency_ms", "<="},
	"tps_user": {"tps_user", ">="}, "output_token_throughput_per_user": {"tps_user", ">="},
}

// ParseSLOs parses a goodput spec: conditions separated by commas or
// spaces, each `metric<=X`, `metric>=X` or aiperf's `metric:X` (which takes
// the metric's natural direction). Times are in ms, tps_user in tokens/s.
func ParseSLOs(spec string) ([]SLO, error) {
	var out []SLO
	for _, part := range strings.FieldsFunc(spec, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' }) {
		var name, op, val string
		switch {
		case strings.Contains(part, "<="):
			name, val, _ = strings.Cut(part, "<=")
			op = "<="
		case strings.Contains(part, ">="):
			name, val, _ = strings.Cut(part, ">=")
			op = ">="
		case strings.Contains(part, ":"):
			name, val, _ = strings.Cut(part, ":")
		default:
			return nil, fmt.Errorf("goodput condition %q: want metric<=value, metric>=value or metric:value", part)
		}
		m, ok := sloMetrics[strings.ToLower(strings.TrimSpace(name))]
		if !ok {
			return nil, fmt.Errorf("goodput condition %q: unknown metric %q (ttft_ms, ttst_ms, itl_ms, latency_ms, tps_user)", part, name)
		}
		if op == "" {
			op = m.op
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return nil, fmt.Errorf("goodput condition %q: threshold %q is not a number >= 0", part, val)
		}
		out = append(out, SLO{Metric: m.name, Op: op, Threshold: v})
	}
	if len(out) == 0 && strings.TrimSpace(spec) != "" {
		return nil, fmt.Errorf("goodput spec %q holds no condition", spec)
	}
	return out, nil
}

// met reports whether rec meets s. A failed request meets nothing; a
// metric a request does not have (ITL or TTST of a one-token answer) is not
// a violation, as there is no gap to be slow.
func (s SLO) met(rec *RequestRecord) bool {
	if !rec.OK {
		return false
	}
	var v float64
	switch s.Metric {
	case "ttft_ms":
		v = rec.TTFTms
	case "ttst_ms":
		if !rec.HasTTST {
			return true
		}
		v = rec.TTSTms
	case "itl_ms":
		if !rec.HasITL {
			return true
		}
		v = rec.ITLms
	case "latency_ms":
		v = rec.LatencyMS
	case "tps_user":
		if !rec.HasITL {
			return true
		}
		if rec.ITLms <= 0 {
			v = math.Inf(1)
		} else {
			v = 1000 / rec.ITLms
		}
	default:
		return false
	}
	if s.Op == ">=" {
		return v >= s.Threshold
	}
	return v <= s.Threshold
}

// Stats summarises one metric over the successful requests.
type Stats struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean"`
	Min   float64 `json:"min"`
	Max   float64 `json:"max"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	Std   float64 `json:"std"`
}

func newStats(v []float64) Stats {
	if len(v) == 0 {
		return Stats{}
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	sum := 0.0
	for _, x := range s {
		sum += x
	}
	mean := sum / float64(len(s))
	ss := 0.0
	for _, x := range s {
		ss += (x - mean) * (x - mean)
	}
	return Stats{Count: len(s), Mean: mean, Min: s[0], Max: s[len(s)-1],
		P50: quantile.Linear(s, 0.5), P90: quantile.Linear(s, 0.9), P99: quantile.Linear(s, 0.99), Std: math.Sqrt(ss / float64(len(s)))}
}

// GoodputReport is the share of requests meeting every SLO.
type GoodputReport struct {
	SLOs     []string `json:"slos"`
	Good     int      `json:"good"`
	Fraction float64  `json:"fraction"` // of sent requests
	PerS     float64  `json:"per_s"`
}

// LoadReport is the result of RunLoad. Rates divide by the benchmark
// duration: from the first request sent to the last response or failure.
type LoadReport struct {
	URL      string         `json:"url"`
	Model    string         `json:"model"`
	Endpoint string         `json:"endpoint"`
	Workload string         `json:"workload"`
	Schedule string         `json:"schedule"`
	Planned  int            `json:"planned"`
	Requests int            `json:"requests"` // sent
	OK       int            `json:"ok"`
	Failed   int            `json:"failed"`
	NotSent  int            `json:"not_sent"`
	Rejected int            `json:"rejected"` // HTTP 429 and 503
	Errors   map[string]int `json:"errors"`   // by kind: http_<status>, timeout, ...
	// FirstError is the first failed request's detail per error kind, so a
	// report of http_400=20 also says what the server objected to.
	FirstError  map[string]string `json:"first_error,omitempty"`
	TraceErrors int               `json:"trace_errors"`
	Interrupted string            `json:"interrupted,omitempty"`

	DurationS    float64 `json:"duration_s"`
	RequestsPerS float64 `json:"requests_per_s"`
	OutputTokS   float64 `json:"output_tok_s"`
	InputTokS    float64 `json:"input_tok_s"`
	MaxLagMS     float64 `json:"max_schedule_lag_ms"`
	// CachedRatio is the server-reported prompt tokens served from its KV
	// cache (usage.prompt_tokens_details.cached_tokens) over all prompt
	// tokens, for requests whose usage said both.
	CachedRatio float64 `json:"cached_prompt_ratio"`

	TTFTms       Stats         `json:"ttft_ms"`
	TTSTms       Stats         `json:"ttst_ms"`
	ITLms        Stats         `json:"itl_ms"`
	LatencyMS    Stats         `json:"latency_ms"`
	TPSUser      Stats         `json:"tps_user"`
	InputTokens  Stats         `json:"input_tokens"`
	OutputTokens Stats         `json:"output_tokens"`
	Goodput      GoodputReport `json:"goodput"`
	// Stages is a kvmesh server's breakdown of its request path over the
	// run (its /metrics); empty for anything else.
	Stages []StageRow `json:"stages,omitempty"`

	records []RequestRecord
}

func buildReport(c *LoadConfig, recs []RequestRecord, planned int) *LoadReport {
	rep := &LoadReport{URL: c.URL, Model: c.Model, Endpoint: c.Endpoint, Schedule: c.schedule(),
		Planned: planned, Requests: len(recs), NotSent: planned - len(recs), Errors: map[string]int{}, FirstError: map[string]string{}, records: recs}
	if c.Synthetic != nil {
		s := c.Synthetic
		rep.Workload = fmt.Sprintf("synthetic: %d groups × %d prompts, system %d + question %d tokens, output %d", s.Groups, s.PromptsPerGroup, s.SystemLen, s.QuestionLen, s.OutputLen)
	} else {
		rep.Workload = "trace " + c.TracePath
	}
	var ttft, ttst, itl, lat, tps, in, out []float64
	first, last := math.Inf(1), math.Inf(-1)
	totalOut, totalIn := 0, 0
	usagePrompt, usageCached := 0, 0
	for i := range recs {
		r := &recs[i]
		first, last = math.Min(first, r.StartS), math.Max(last, r.EndS)
		rep.MaxLagMS = math.Max(rep.MaxLagMS, r.LagMS)
		if !r.OK {
			rep.Failed++
			rep.Errors[r.Error]++
			if _, seen := rep.FirstError[r.Error]; !seen && r.Detail != "" {
				rep.FirstError[r.Error] = r.Detail
			}
			if r.Status == 429 || r.Status == 503 {
				rep.Rejected++
			}
			continue
		}
		rep.OK++
		ttft = append(ttft, r.TTFTms)
		lat = append(lat, r.LatencyMS)
		if r.HasTTST {
			ttst = append(ttst, r.TTSTms)
		}
		if r.HasITL {
			itl = append(itl, r.ITLms)
			if r.ITLms > 0 {
				tps = append(tps, 1000/r.ITLms)
			}
		}
		in = append(in, float64(r.InputTokens))
		out = append(out, float64(r.OutputTokens))
		totalOut += r.OutputTokens
		totalIn += r.InputTokens
		if r.PromptTokens > 0 {
			usagePrompt += r.PromptTokens
			usageCached += r.CachedTokens
		}
		good := true
		for _, s := range c.Goodput {
			good = good && s.met(r)
		}
		r.Good = good
		if good {
			rep.Goodput.Good++
		}
	}
	if len(recs) > 0 {
		rep.DurationS = last - first
	}
	if rep.DurationS > 0 {
		rep.RequestsPerS = float64(rep.OK) / rep.DurationS
		rep.OutputTokS = float64(totalOut) / rep.DurationS
		rep.InputTokS = float64(totalIn) / rep.DurationS
		rep.Goodput.PerS = float64(rep.Goodput.Good) / rep.DurationS
	}
	if usagePrompt > 0 {
		rep.CachedRatio = float64(usageCached) / float64(usagePrompt)
	}
	if len(recs) > 0 {
		rep.Goodput.Fraction = float64(rep.Goodput.Good) / float64(len(recs))
	}
	rep.Goodput.SLOs = []string{}
	for _, s := range c.Goodput {
		rep.Goodput.SLOs = append(rep.Goodput.SLOs, s.String())
	}
	rep.TTFTms, rep.TTSTms, rep.ITLms, rep.LatencyMS = newStats(ttft), newStats(ttst), newStats(itl), newStats(lat)
	rep.TPSUser, rep.InputTokens, rep.OutputTokens = newStats(tps), newStats(in), newStats(out)
	return rep
}

// Records returns the per-request records (sent requests, in workload order).
func (rep *LoadReport) Records() []RequestRecord { return rep.records }

// SummaryLine is the one-line result: the last line of the stdout summary.
func (rep *LoadReport) SummaryLine() string {
	return fmt.Sprintf("load: requests=%d ok=%d ttft_p50_ms=%.1f ttft_p99_ms=%.1f itl_p50_ms=%.2f output_tok_s=%.1f goodput=%.3f",
		rep.Requests, rep.OK, rep.TTFTms.P50, rep.TTFTms.P99, rep.ITLms.P50, rep.OutputTokS, rep.Goodput.Fraction)
}

func (rep *LoadReport) errorList() string {
	if len(rep.Errors) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(rep.Errors))
	for k := range rep.Errors {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, rep.Errors[k])
	}
	return strings.Join(parts, " ")
}

// printFirstErrors prints, per error kind, the first request's message.
func (rep *LoadReport) printFirstErrors(w io.Writer) {
	keys := make([]string, 0, len(rep.FirstError))
	for k := range rep.FirstError {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "  first %s: %s\n", k, rep.FirstError[k])
	}
}

func (rep *LoadReport) metricRows() []struct {
	name string
	s    Stats
} {
	return []struct {
		name string
		s    Stats
	}{
		{"ttft_ms", rep.TTFTms}, {"ttst_ms", rep.TTSTms}, {"itl_ms", rep.ITLms}, {"latency_ms", rep.LatencyMS},
		{"tps_user", rep.TPSUser}, {"input_tokens", rep.InputTokens}, {"output_tokens", rep.OutputTokens},
	}
}

func (rep *LoadReport) goodputText() string {
	slos := "no SLO: every successful request"
	if len(rep.Goodput.SLOs) > 0 {
		slos = strings.Join(rep.Goodput.SLOs, ", ")
	}
	return fmt.Sprintf("%d good (%s) = %.3f of requests, %.3f req/s", rep.Goodput.Good, slos, rep.Goodput.Fraction, rep.Goodput.PerS)
}

func (rep *LoadReport) printSummary(w io.Writer) {
	fmt.Fprintf(w, "bench load: %s model=%s endpoint=%s\n", rep.URL, rep.Model, rep.Endpoint)
	fmt.Fprintf(w, "workload: %s; %s\n", rep.Workload, rep.Schedule)
	if rep.Interrupted != "" {
		fmt.Fprintf(w, "INTERRUPTED (%s): partial report\n", rep.Interrupted)
	}
	fmt.Fprintf(w, "requests: planned %d, sent %d, ok %d, failed %d (rejected %d), not sent %d; trace lines skipped %d\n",
		rep.Planned, rep.Requests, rep.OK, rep.Failed, rep.Rejected, rep.NotSent, rep.TraceErrors)
	fmt.Fprintf(w, "errors: %s\n", rep.errorList())
	rep.printFirstErrors(w)
	fmt.Fprintf(w, "duration %.2f s: %.3f req/s, %.1f output tok/s, %.1f input tok/s, max schedule lag %.1f ms\n",
		rep.DurationS, rep.RequestsPerS, rep.OutputTokS, rep.InputTokS, rep.MaxLagMS)
	fmt.Fprintf(w, "goodput: %s\n", rep.goodputText())
	fmt.Fprintf(w, "server prefix cache: %.4f of prompt tokens cached (usage.prompt_tokens_details.cached_tokens)\n", rep.CachedRatio)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "metric\tcount\tmean\tp50\tp90\tp99\tmin\tmax\t")
	for _, m := range rep.metricRows() {
		s := m.s
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", m.name, s.Count, s.Mean, s.P50, s.P90, s.P99, s.Min, s.Max)
	}
	tw.Flush()
	if len(rep.Stages) > 0 {
		fmt.Fprintln(w, "server request path by stage (kvmesh_request_stage_seconds, first attempts; ms from its buckets, ±25%):")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "stage\tcount\tp50\tp99\t")
		for _, s := range rep.Stages {
			fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.3f\t\n", s.Stage, s.Count, s.P50ms, s.P99ms)
		}
		tw.Flush()
	}
	fmt.Fprintln(w, rep.SummaryLine())
}

// Output file names inside LoadConfig.OutDir.
const (
	LoadReportFile  = "report.json"
	LoadRecordsFile = "requests.jsonl"
	LoadSummaryFile = "summary.md"
	LoadTTFTPlot    = "ttft_cdf.svg"
	LoadLatencyPlot = "latency_over_time.svg"
)

func (rep *LoadReport) markdown(w io.Writer) {
	fmt.Fprintf(w, "# kvmesh bench load\n\n")
	fmt.Fprintf(w, "- endpoint: `%s` (%s), model `%s`\n- workload: %s\n- schedule: %s\n", rep.URL, rep.Endpoint, rep.Model, rep.Workload, rep.Schedule)
	if rep.Interrupted != "" {
		fmt.Fprintf(w, "- **interrupted** (%s): partial results\n", rep.Interrupted)
	}
	fmt.Fprintf(w, "\n| requests | sent | ok | failed | rejected | not sent | duration s | req/s | output tok/s | goodput | goodput req/s |\n")
	fmt.Fprintf(w, "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	fmt.Fprintf(w, "| %d | %d | %d | %d | %d | %d | %.2f | %.3f | %.1f | %.3f | %.3f |\n\n",
		rep.Planned, rep.Requests, rep.OK, rep.Failed, rep.Rejected, rep.NotSent, rep.DurationS, rep.RequestsPerS, rep.OutputTokS, rep.Goodput.Fraction, rep.Goodput.PerS)
	fmt.Fprintf(w, "Goodput: %s.\n\nErrors: %s.\n\n", rep.goodputText(), rep.errorList())
	fmt.Fprintf(w, "| metric | count | mean | p50 | p90 | p99 | min | max |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, m := range rep.metricRows() {
		s := m.s
		fmt.Fprintf(w, "| %s | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", m.name, s.Count, s.Mean, s.P50, s.P90, s.P99, s.Min, s.Max)
	}
	if len(rep.Stages) > 0 {
		fmt.Fprintf(w, "\nThe server's request path by stage (ms, from its histogram buckets, ±25%%):\n\n| stage | count | p50 | p99 |\n| --- | ---: | ---: | ---: |\n")
		for _, s := range rep.Stages {
			fmt.Fprintf(w, "| %s | %d | %.3f | %.3f |\n", s.Stage, s.Count, s.P50ms, s.P99ms)
		}
	}
	fmt.Fprintf(w, "\n![TTFT CDF](%s)\n\n![latency over time](%s)\n", LoadTTFTPlot, LoadLatencyPlot)
}

func writeFileAtomic(path string, fill func(w io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".load-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	bw := bufio.NewWriter(tmp)
	if err := fill(bw); err != nil {
		tmp.Close()
		return err
	}
	if err := bw.Flush(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// writeOutputs writes the report, per-request records, markdown summary
// and plots into dir (created if missing).
func (rep *LoadReport) writeOutputs(dir string, recs []RequestRecord) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("output folder: %w", err)
	}
	steps := []struct {
		name string
		fill func(w io.Writer) error
	}{
		{LoadReportFile, func(w io.Writer) error {
			e := json.NewEncoder(w)
			e.SetIndent("", "  ")
			return e.Encode(rep)
		}},
		{LoadRecordsFile, func(w io.Writer) error {
			e := json.NewEncoder(w)
			for i := range recs {
				if err := e.Encode(&recs[i]); err != nil {
					return err
				}
			}
			return nil
		}},
		{LoadSummaryFile, func(w io.Writer) error { rep.markdown(w); return nil }},
		{LoadTTFTPlot, func(w io.Writer) error { return ttftChart(rep, recs).WriteSVG(w) }},
		{LoadLatencyPlot, func(w io.Writer) error { return latencyChart(rep, recs).WriteSVG(w) }},
	}
	for _, s := range steps {
		if err := writeFileAtomic(filepath.Join(dir, s.name), s.fill); err != nil {
			return fmt.Errorf("writing %s: %w", s.name, err)
		}
	}
	return nil
}

func ttftChart(rep *LoadReport, recs []RequestRecord) *plot.LineChart {
	var v []float64
	for i := range recs {
		if recs[i].OK {
			v = append(v, recs[i].TTFTms)
		}
	}
	return plot.CDFChart(fmt.Sprintf("TTFT CDF (%d ok requests, p50 %.0f ms, p99 %.0f ms)", rep.OK, rep.TTFTms.P50, rep.TTFTms.P99), "time to first token (ms)", plot.CDF("ttft", v))
}

func latencyChart(rep *LoadReport, recs []RequestRecord) *plot.LineChart {
	var lat, ttft, fail plot.Series
	lat.Name, ttft.Name, fail.Name = "request latency", "ttft", "failed (time to failure)"
	for i := range recs {
		r := &recs[i]
		if r.OK {
			lat.X, lat.Y = append(lat.X, r.StartS), append(lat.Y, r.LatencyMS)
			ttft.X, ttft.Y = append(ttft.X, r.StartS), append(ttft.Y, r.TTFTms)
		} else {
			fail.X, fail.Y = append(fail.X, r.StartS), append(fail.Y, (r.EndS-r.StartS)*1000)
		}
	}
	series := []plot.Series{lat, ttft}
	if len(fail.X) > 0 {
		series = append(series, fail)
	}
	return &plot.LineChart{Title: "Latency over time", XLabel: "request start (s from run start)", YLabel: "ms", Series: series, Style: plot.Points}
}

// startProgress shows progress on c.Progress until finished is closed; the
// returned function waits for the final redraw.
func (r *loadRunner) startProgress(wg *sync.WaitGroup, finished <-chan struct{}) func() {
	w := r.c.Progress
	if w == nil {
		return func() {}
	}
	exited := make(chan struct{})
	every := r.c.ProgressEvery
	if r.c.ProgressTTY {
		every = 200 * time.Millisecond
	}
	wg.Go(func() {
		defer close(exited)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-finished:
				if r.c.ProgressTTY {
					fmt.Fprintf(w, "\r\x1b[K%s\n", r.progressText(true))
				} else {
					fmt.Fprintf(w, "progress: %s\n", r.progressText(false))
				}
				return
			case <-t.C:
				if r.c.ProgressTTY {
					fmt.Fprintf(w, "\r\x1b[K%s", r.progressText(true))
				} else {
					fmt.Fprintf(w, "progress: %s\n", r.progressText(false))
				}
			}
		}
	})
	return func() { <-exited }
}

func (r *loadRunner) progressText(bar bool) string {
	total := len(r.items)
	done, failed, sent := r.nDone.Load(), r.nFailed.Load(), r.nSent.Load()
	el := time.Since(r.start).Seconds()
	rate := 0.0
	if el > 0 {
		rate = float64(done) / el
	}
	s := fmt.Sprintf("%d/%d done, %d in flight, %d errors, %.1f s, %.2f req/s", done, total, sent-done, failed, el, rate)
	if !bar {
		return s
	}
	const width = 30
	fill := 0
	if total > 0 {
		fill = int(float64(width) * float64(done) / float64(total))
	}
	return "[" + strings.Repeat("#", fill) + strings.Repeat(".", width-fill) + "] " + s
}
