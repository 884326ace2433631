package testutil

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// sample is one series as the text exposition writes it: histograms and
// summaries as their _count and _sum series.
type sample struct {
	name   string
	labels []*dto.LabelPair // sorted by name
	value  float64
}

func (s sample) key() string {
	if len(s.labels) == 0 {
		return s.name
	}
	ls := make([]string, len(s.labels))
	for i, l := range s.labels {
		ls[i] = fmt.Sprintf("%s=%q", l.GetName(), l.GetValue())
	}
	return s.name + "{" + strings.Join(ls, ",") + "}"
}

func (s sample) has(labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		if !slices.ContainsFunc(s.labels, func(l *dto.LabelPair) bool {
			return l.GetName() == labels[i] && l.GetValue() == labels[i+1]
		}) {
			return false
		}
	}
	return true
}

func flatten(mfs []*dto.MetricFamily) []sample {
	var out []sample
	for _, mf := range mfs {
		name := mf.GetName()
		for _, m := range mf.GetMetric() {
			ls := slices.Clone(m.GetLabel())
			slices.SortFunc(ls, func(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) })
			add := func(suffix string, v float64) { out = append(out, sample{name + suffix, ls, v}) }
			switch {
			case m.Histogram != nil:
				add("_count", float64(m.Histogram.GetSampleCount()))
				add("_sum", m.Histogram.GetSampleSum())
			case m.Summary != nil:
				add("_count", float64(m.Summary.GetSampleCount()))
				add("_sum", m.Summary.GetSampleSum())
			default:
				add("", m.GetCounter().GetValue()+m.GetGauge().GetValue()+m.GetUntyped().GetValue())
			}
		}
	}
	return out
}

func gather(t testing.TB, g prometheus.Gatherer) []sample {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return flatten(mfs)
}

func toMap(ss []sample) map[string]float64 {
	out := make(map[string]float64, len(ss))
	for _, s := range ss {
		out[s.key()] = s.value
	}
	return out
}

// Metrics reads every series of g into a map keyed as the text exposition
// writes them: name{label="value",...} with labels sorted by name, a bare
// name without labels, and histograms and summaries as name_count and
// name_sum.
func Metrics(t testing.TB, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	return toMap(gather(t, g))
}

// Value is the sum of g's series called name (name_count for a histogram's
// count) whose labels include the given name, value pairs; 0 if none.
func Value(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	v := 0.0
	for _, s := range gather(t, g) {
		if s.name == name && s.has(labels) {
			v += s.value
		}
	}
	return v
}

// Scrape reads a Prometheus text endpoint (a /metrics URL) into the same
// map as Metrics.
func Scrape(t testing.TB, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	mfs := make([]*dto.MetricFamily, 0, len(fams))
	for _, mf := range fams {
		mfs = append(mfs, mf)
	}
	return toMap(flatten(mfs))
}
