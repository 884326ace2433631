package stages

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Snapshot is a server's stage histogram at one moment: per stage, the
// cumulative count at each bucket's upper bound (the last bound +Inf).
type Snapshot map[string]Hist

// Hist is one stage's cumulative buckets.
type Hist struct {
	Upper []float64
	Count []uint64
}

// Total is the number of observations.
func (h Hist) Total() uint64 {
	if len(h.Count) == 0 {
		return 0
	}
	return h.Count[len(h.Count)-1]
}

// Scrape reads the stage histogram from a Prometheus text endpoint. A
// server without the family gives an empty snapshot and no error.
func Scrape(ctx context.Context, c *http.Client, url, bearer string) (Snapshot, error) {
	fams, err := Families(ctx, c, url, bearer)
	if err != nil {
		return nil, err
	}
	return fromFamily(fams[Metric]), nil
}

// Families reads every metric family of a Prometheus text endpoint (a
// /metrics URL), sending bearer as a bearer token when set.
func Families(ctx context.Context, c *http.Client, url, bearer string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain")
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return fams, nil
}

func fromFamily(f *dto.MetricFamily) Snapshot {
	out := Snapshot{}
	if f == nil {
		return out
	}
	for _, m := range f.GetMetric() {
		h := m.GetHistogram()
		if h == nil {
			continue
		}
		var stage string
		for _, l := range m.GetLabel() {
			if l.GetName() == "stage" {
				stage = l.GetValue()
			}
		}
		var hist Hist
		for _, b := range h.GetBucket() {
			hist.Upper = append(hist.Upper, b.GetUpperBound())
			hist.Count = append(hist.Count, b.GetCumulativeCount())
		}
		if n := len(hist.Upper); n == 0 || !math.IsInf(hist.Upper[n-1], 1) {
			hist.Upper = append(hist.Upper, math.Inf(1))
			hist.Count = append(hist.Count, h.GetSampleCount())
		}
		out[stage] = hist
	}
	return out
}

// Since is what was observed after before: s less before, per stage with
// the same buckets (a stage whose buckets changed, as after a server
// restart, is taken whole).
func (s Snapshot) Since(before Snapshot) Snapshot {
	out := Snapshot{}
	for stage, h := range s {
		b, ok := before[stage]
		if !ok || len(b.Upper) != len(h.Upper) || b.Total() > h.Total() {
			out[stage] = h
			continue
		}
		d := Hist{Upper: h.Upper, Count: make([]uint64, len(h.Count))}
		for i := range h.Count {
			d.Count[i] = h.Count[i] - min(b.Count[i], h.Count[i])
		}
		out[stage] = d
	}
	return out
}

// Quantile is the q-quantile of h in seconds, interpolated linearly within
// its bucket as Prometheus' histogram_quantile does; NaN when empty. A
// quantile in the +Inf bucket is the last finite bound.
func (h Hist) Quantile(q float64) float64 {
	n := h.Total()
	if n == 0 {
		return math.NaN()
	}
	rank := q * float64(n)
	i := sort.Search(len(h.Count), func(i int) bool { return float64(h.Count[i]) >= rank })
	if i >= len(h.Count) {
		i = len(h.Count) - 1
	}
	if math.IsInf(h.Upper[i], 1) {
		if i == 0 {
			return math.NaN()
		}
		return h.Upper[i-1]
	}
	lo, below := 0.0, 0.0
	if i > 0 {
		lo, below = h.Upper[i-1], float64(h.Count[i-1])
	}
	in := float64(h.Count[i]) - below
	if in <= 0 {
		return h.Upper[i]
	}
	return lo + (h.Upper[i]-lo)*(rank-below)/in
}
