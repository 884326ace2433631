// Package plot writes small, deterministic, standalone SVG charts: line and
// scatter charts (values over time, CDFs) and grouped bar charts, with axes,
// ticks, labels, a legend and a title. It has no kvmesh imports so any
// command (bench load, twin) can use it; equal inputs give byte-identical
// output.
//
// It imports nothing of kvmesh.
package plot

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Chart is anything that renders itself as a standalone SVG document.
type Chart interface {
	WriteSVG(w io.Writer) error
}

// Series is one named set of (x, y) points of a line chart. Points with a
// non-finite coordinate (or a non-positive one on a log axis) are skipped.
type Series struct {
	Name string
	X, Y []float64
}

// Range fixes an axis range. The zero value means "fit the data".
type Range struct{ Min, Max float64 }

func (r Range) auto() bool { return r.Min == 0 && r.Max == 0 }

// Style is how a LineChart draws its series.
type Style int

const (
	// Lines joins the points in the given order.
	Lines Style = iota
	// Points draws a marker per point (a scatter plot).
	Points
	// LinesPoints draws both.
	LinesPoints
	// Steps draws a right-continuous step function (horizontal, then
	// vertical), the usual shape of an empirical CDF.
	Steps
)

// LineChart plots one or more series over shared axes.
type LineChart struct {
	Title, XLabel, YLabel string
	Series                []Series
	Style                 Style
	LogX, LogY            bool
	X, Y                  Range
	Width, Height         int // pixels; 0 means 720 × 440
}

// Bars is one named series of a BarChart: one value per category.
type Bars struct {
	Name   string
	Values []float64
}

// BarChart draws, for each category along the x axis, a group with one bar
// per series.
type BarChart struct {
	Title, XLabel, YLabel string
	Categories            []string
	Series                []Bars
	Y                     Range
	Width, Height         int // pixels; 0 means 720 × 440
}

// Palette is the colour cycle series take in order.
var Palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

func color(i int) string { return Palette[i%len(Palette)] }

// Dashes are the stroke patterns line series take in order (the first
// solid), so lines that coincide stay distinguishable, in grey print too.
var Dashes = []string{"", "7 4", "2 3", "10 3 2 3", "4 4", "1 5"}

func dash(i int) string {
	if d := Dashes[i%len(Dashes)]; d != "" {
		return " stroke-dasharray=\"" + d + "\""
	}
	return ""
}

// CDF returns the empirical cumulative distribution of values as a series:
// the sorted finite values against i/n. Use it with Style Steps.
func CDF(name string, values []float64) Series {
	xs := make([]float64, 0, len(values))
	for _, v := range values {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			xs = append(xs, v)
		}
	}
	sort.Float64s(xs)
	ys := make([]float64, len(xs))
	for i := range xs {
		ys[i] = float64(i+1) / float64(len(xs))
	}
	return Series{Name: name, X: xs, Y: ys}
}

// CDFChart is a step chart of the given CDF series with y fixed to [0, 1].
func CDFChart(title, xLabel string, series ...Series) *LineChart {
	return &LineChart{Title: title, XLabel: xLabel, YLabel: "fraction ≤ x", Series: series, Style: Steps, Y: Range{0, 1}}
}

// WriteFile renders c into the file at path (created or truncated), via a
// temporary file so a reader never sees a half-written chart.
func WriteFile(path string, c Chart) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".plot-*.svg")
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := c.WriteSVG(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	// CreateTemp makes the file private; a chart is an ordinary output.
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	return nil
}

// layout is the pixel geometry shared by both chart kinds.
type layout struct {
	w, h                  float64
	left, top, right, bot float64 // plot area edges
	legend                []string
	legendX, legendY      float64
}

const (
	defaultW, defaultH = 720, 440
	charW              = 6.6 // rough width of a 12px sans-serif glyph
)

func newLayout(w, h int, title, xLabel, yLabel string, legend []string) (layout, error) {
	if w == 0 && h == 0 {
		w, h = defaultW, defaultH
	}
	if w < 120 || h < 100 || w > 100000 || h > 100000 {
		return layout{}, fmt.Errorf("plot: size %d×%d out of range (120×100 to 100000×100000)", w, h)
	}
	l := layout{w: float64(w), h: float64(h), left: 72, top: 20, right: float64(w) - 20, bot: float64(h) - 44}
	if title != "" {
		l.top = 40
	}
	if xLabel == "" {
		l.bot += 16
	}
	if yLabel == "" {
		l.left -= 16
	}
	if len(legend) > 0 {
		maxLen := 0
		for _, n := range legend {
			if k := len([]rune(n)); k > maxLen {
				maxLen = k
			}
		}
		lw := math.Min(float64(maxLen)*charW+40, l.w/3)
		l.right -= lw
		l.legendX, l.legendY = l.right+14, l.top+6
		l.legend = legend
	}
	if l.right-l.left < 40 || l.bot-l.top < 40 {
		return layout{}, fmt.Errorf("plot: size %d×%d leaves no room for the plot area", w, h)
	}
	return l, nil
}

// svgWriter accumulates output and keeps the first write error.
type svgWriter struct {
	bw  *bufio.Writer
	err error
}

func (s *svgWriter) printf(format string, a ...any) {
	if s.err == nil {
		_, s.err = fmt.Fprintf(s.bw, format, a...)
	}
}

func (s *svgWriter) flush() error {
	if s.err == nil {
		s.err = s.bw.Flush()
	}
	if s.err != nil {
		return fmt.Errorf("plot: %w", s.err)
	}
	return nil
}

func esc(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '<':
			b.WriteString("&lt;")
		case '>':
			b.WriteString("&gt;")
		case '&':
			b.WriteString("&amp;")
		case '"':
			b.WriteString("&quot;")
		case '\'':
			b.WriteString("&apos;")
		default:
			// XML 1.0 forbids most control characters.
			if r < 0x20 && r != '\t' && r != '\n' && r != '\r' || r == 0xFFFE || r == 0xFFFF {
				b.WriteRune('\uFFFD')
			} else {
				b.WriteRune(r)
			}
		}
	}
	return b.String()
}

// f formats a pixel coordinate with fixed precision so output is stable.
func f(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }

func (s *svgWriter) header(l layout, title string) {
	s.printf("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n")
	s.printf("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%s\" height=\"%s\" viewBox=\"0 0 %s %s\" font-family=\"sans-serif\" font-size=\"12\">\n", f(l.w), f(l.h), f(l.w), f(l.h))
	if title != "" {
		s.printf("<title>%s</title>\n", esc(title))
	}
	s.printf("<rect x=\"0\" y=\"0\" width=\"%s\" height=\"%s\" fill=\"#ffffff\"/>\n", f(l.w), f(l.h))
	s.printf("<defs><clipPath id=\"plot-area\"><rect x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\"/></clipPath></defs>\n",
		f(l.left), f(l.top), f(l.right-l.left), f(l.bot-l.top))
	if title != "" {
		s.printf("<text class=\"title\" x=\"%s\" y=\"24\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">%s</text>\n", f((l.left+l.right)/2), esc(title))
	}
}

func (s *svgWriter) labels(l layout, xLabel, yLabel string) {
	if xLabel != "" {
		s.printf("<text class=\"xlabel\" x=\"%s\" y=\"%s\" text-anchor=\"middle\">%s</text>\n", f((l.left+l.right)/2), f(l.h-10), esc(xLabel))
	}
	if yLabel != "" {
		x, y := 16.0, (l.top+l.bot)/2
		s.printf("<text class=\"ylabel\" x=\"%s\" y=\"%s\" text-anchor=\"middle\" transform=\"rotate(-90 %s %s)\">%s</text>\n", f(x), f(y), f(x), f(y), esc(yLabel))
	}
}

func (s *svgWriter) legend(l layout, lines bool) {
	if len(l.legend) == 0 {
		return
	}
	s.printf("<g class=\"legend\">\n")
	for i, name := range l.legend {
		y := l.legendY + float64(i)*18
		if lines { // a stroke sample, with the series' dash pattern
			s.printf("<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\" stroke=\"%s\" stroke-width=\"2\"%s/>", f(l.legendX-6), f(y+5), f(l.legendX+16), f(y+5), color(i), dash(i))
		} else {
			s.printf("<rect x=\"%s\" y=\"%s\" width=\"14\" height=\"10\" fill=\"%s\"/>", f(l.legendX), f(y), color(i))
		}
		s.printf("<text x=\"%s\" y=\"%s\">%s</text>\n", f(l.legendX+20), f(y+9.5), esc(name))
	}
	s.printf("</g>\n")
}

func (s *svgWriter) frame(l layout) {
	s.printf("<rect class=\"frame\" x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\" fill=\"none\" stroke=\"#333333\"/>\n",
		f(l.left), f(l.top), f(l.right-l.left), f(l.bot-l.top))
}

// scale maps data values to pixels along one axis.
type scale struct {
	lo, hi   float64 // data range (log10 of it on a log axis)
	p0, p1   float64 // pixel range
	log      bool
	ticks    []float64 // data values
	tickText []string
}

func (sc *scale) px(v float64) float64 {
	if sc.log {
		v = math.Log10(v)
	}
	return sc.p0 + (v-sc.lo)/(sc.hi-sc.lo)*(sc.p1-sc.p0)
}

func usable(v float64, log bool) bool {
	return !math.IsNaN(v) && !math.IsInf(v, 0) && (!log || v > 0)
}

// newScale builds an axis over the data extent [lo, hi] (ok false: no
// data) or over the fixed range r.
func newScale(lo, hi float64, ok bool, r Range, log bool, p0, p1 float64, includeZero bool) (*scale, error) {
	sc := &scale{p0: p0, p1: p1, log: log}
	if !r.auto() {
		if !(r.Min < r.Max) || math.IsNaN(r.Min) || math.IsInf(r.Min, 0) || math.IsInf(r.Max, 0) {
			return nil, fmt.Errorf("plot: axis range [%v, %v] is empty or not finite", r.Min, r.Max)
		}
		if log && r.Min <= 0 {
			return nil, fmt.Errorf("plot: log axis range [%v, %v] must be positive", r.Min, r.Max)
		}
		lo, hi = r.Min, r.Max
		if log {
			lo, hi = math.Log10(lo), math.Log10(hi)
			sc.lo, sc.hi = lo, hi
			sc.ticks = logTicks(lo, hi)
		} else {
			sc.lo, sc.hi = lo, hi
			step := niceStep(hi-lo, 6)
			for t := math.Ceil(lo/step-1e-9) * step; t <= hi+step*1e-9; t += step {
				sc.ticks = append(sc.ticks, cleanZero(t))
			}
		}
		sc.labels()
		return sc, nil
	}
	if !ok {
		lo, hi = 0, 1
		if log {
			lo, hi = 1, 10
		}
	}
	if includeZero && !log {
		lo, hi = math.Min(lo, 0), math.Max(hi, 0)
	}
	if log {
		lo, hi = math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
		if lo == hi {
			hi = lo + 1
		}
		sc.lo, sc.hi = lo, hi
		sc.ticks = logTicks(lo, hi)
		sc.labels()
		return sc, nil
	}
	if lo == hi {
		d := math.Abs(lo) * 0.1
		if d == 0 {
			d = 1
		}
		lo, hi = lo-d, hi+d
		if includeZero && lo < 0 && hi-d >= 0 {
			lo = 0
		}
	}
	step := niceStep(hi-lo, 6)
	lo, hi = math.Floor(lo/step+1e-9)*step, math.Ceil(hi/step-1e-9)*step
	sc.lo, sc.hi = lo, hi
	n := int(math.Round((hi - lo) / step))
	for i := 0; i <= n; i++ {
		sc.ticks = append(sc.ticks, cleanZero(lo+float64(i)*step))
	}
	sc.labels()
	return sc, nil
}

func cleanZero(v float64) float64 {
	if math.Abs(v) < 1e-12 {
		return 0
	}
	return v
}

// niceStep is a 1, 2 or 5 × 10^k step giving about n intervals over span.
func niceStep(span float64, n int) float64 {
	if !(span > 0) || math.IsInf(span, 0) {
		return 1
	}
	raw := span / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	switch r := raw / mag; {
	case r <= 1:
		return mag
	case r <= 2:
		return 2 * mag
	case r <= 5:
		return 5 * mag
	default:
		return 10 * mag
	}
}

// logTicks returns tick values (not logs) for the log10 range [lo, hi]:
// the powers of ten, plus 2× and 5× when the range spans under two decades.
func logTicks(lo, hi float64) []float64 {
	var out []float64
	mults := []float64{1}
	if hi-lo < 2 {
		mults = []float64{1, 2, 5}
	}
	for e := math.Floor(lo); e <= math.Ceil(hi); e++ {
		for _, m := range mults {
			v := m * math.Pow(10, e)
			if lv := math.Log10(v); lv >= lo-1e-9 && lv <= hi+1e-9 {
				out = append(out, v)
			}
		}
	}
	return out
}

func (sc *scale) labels() {
	sc.tickText = make([]string, len(sc.ticks))
	dec := 0
	if !sc.log && len(sc.ticks) > 1 {
		step := sc.ticks[1] - sc.ticks[0]
		if d := -int(math.Floor(math.Log10(step) + 1e-9)); d > 0 {
			dec = d
		}
	}
	for i, t := range sc.ticks {
		sc.tickText[i] = tickLabel(t, dec, sc.log)
	}
}

func tickLabel(v float64, dec int, log bool) string {
	a := math.Abs(v)
	switch {
	case a >= 1e9:
		return trimFloat(v/1e9) + "G"
	case a >= 1e6:
		return trimFloat(v/1e6) + "M"
	case a >= 1e4:
		return trimFloat(v/1e3) + "k"
	case log:
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	return strconv.FormatFloat(v, 'f', dec, 64)
}

func trimFloat(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

func (s *svgWriter) xAxis(l layout, sc *scale) {
	s.printf("<g class=\"xaxis\">\n")
	for i, t := range sc.ticks {
		x := sc.px(t)
		s.printf("<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\" stroke=\"#e0e0e0\"/>", f(x), f(l.top), f(x), f(l.bot))
		s.printf("<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\" stroke=\"#333333\"/>", f(x), f(l.bot), f(x), f(l.bot+5))
		s.printf("<text class=\"tick\" x=\"%s\" y=\"%s\" text-anchor=\"middle\">%s</text>\n", f(x), f(l.bot+18), esc(sc.tickText[i]))
	}
	s.printf("</g>\n")
}

func (s *svgWriter) yAxis(l layout, sc *scale) {
	s.printf("<g class=\"yaxis\">\n")
	for i, t := range sc.ticks {
		y := sc.px(t)
		s.printf("<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\" stroke=\"#e0e0e0\"/>", f(l.left), f(y), f(l.right), f(y))
		s.printf("<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\" stroke=\"#333333\"/>", f(l.left-5), f(y), f(l.left), f(y))
		s.printf("<text class=\"tick\" x=\"%s\" y=\"%s\" text-anchor=\"end\">%s</text>\n", f(l.left-8), f(y+4), esc(sc.tickText[i]))
	}
	s.printf("</g>\n")
}

func legendNames[T any](items []T, name func(T) string) []string {
	var names []string
	named := false
	for i, it := range items {
		n := name(it)
		if n != "" {
			named = true
		} else {
			n = "series " + strconv.Itoa(i+1)
		}
		names = append(names, n)
	}
	if !named && len(items) <= 1 {
		return nil
	}
	return names
}

// WriteSVG renders the chart.
func (c *LineChart) WriteSVG(w io.Writer) error {
	if c.Style < Lines || c.Style > Steps {
		return fmt.Errorf("plot: unknown style %d", c.Style)
	}
	xlo, xhi, ylo, yhi := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for i, sr := range c.Series {
		if len(sr.X) != len(sr.Y) {
			return fmt.Errorf("plot: series %d (%q) has %d x and %d y values", i, sr.Name, len(sr.X), len(sr.Y))
		}
		for j := range sr.X {
			x, y := sr.X[j], sr.Y[j]
			if usable(x, c.LogX) && usable(y, c.LogY) {
				xlo, xhi = math.Min(xlo, x), math.Max(xhi, x)
				ylo, yhi = math.Min(ylo, y), math.Max(yhi, y)
			}
		}
	}
	have := xlo <= xhi
	l, err := newLayout(c.Width, c.Height, c.Title, c.XLabel, c.YLabel, legendNames(c.Series, func(s Series) string { return s.Name }))
	if err != nil {
		return err
	}
	xs, err := newScale(xlo, xhi, have, c.X, c.LogX, l.left, l.right, false)
	if err != nil {
		return err
	}
	ys, err := newScale(ylo, yhi, have, c.Y, c.LogY, l.bot, l.top, false)
	if err != nil {
		return err
	}
	s := &svgWriter{bw: bufio.NewWriter(w)}
	s.header(l, c.Title)
	s.xAxis(l, xs)
	s.yAxis(l, ys)
	for i, sr := range c.Series {
		s.printf("<g class=\"series\" data-name=\"%s\" clip-path=\"url(#plot-area)\">\n", esc(sr.Name))
		var pts []string
		var lastY float64
		for j := range sr.X {
			x, y := sr.X[j], sr.Y[j]
			if !usable(x, c.LogX) || !usable(y, c.LogY) {
				continue
			}
			px, py := f(xs.px(x)), f(ys.px(y))
			if c.Style == Steps {
				if len(pts) == 0 {
					// A CDF starts at the floor of the axis.
					pts = append(pts, px+","+f(l.bot))
				} else {
					pts = append(pts, px+","+f(lastY))
				}
				lastY = ys.px(y)
			}
			pts = append(pts, px+","+py)
		}
		if c.Style != Points && len(pts) > 0 {
			s.printf("<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\"%s points=\"%s\"/>\n", color(i), dash(i), strings.Join(pts, " "))
		}
		if c.Style == Points || c.Style == LinesPoints {
			for j := range sr.X {
				x, y := sr.X[j], sr.Y[j]
				if usable(x, c.LogX) && usable(y, c.LogY) {
					s.printf("<circle cx=\"%s\" cy=\"%s\" r=\"2.2\" fill=\"%s\"/>\n", f(xs.px(x)), f(ys.px(y)), color(i))
				}
			}
		}
		s.printf("</g>\n")
	}
	if !have {
		s.printf("<text class=\"nodata\" x=\"%s\" y=\"%s\" text-anchor=\"middle\" fill=\"#777777\">no data</text>\n", f((l.left+l.right)/2), f((l.top+l.bot)/2))
	}
	s.frame(l)
	s.labels(l, c.XLabel, c.YLabel)
	s.legend(l, c.Style != Points)
	s.printf("</svg>\n")
	return s.flush()
}

// WriteSVG renders the chart.
func (c *BarChart) WriteSVG(w io.Writer) error {
	if len(c.Categories) == 0 {
		return errors.New("plot: bar chart has no categories")
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for i, b := range c.Series {
		if len(b.Values) != len(c.Categories) {
			return fmt.Errorf("plot: bar series %d (%q) has %d values for %d categories", i, b.Name, len(b.Values), len(c.Categories))
		}
		for _, v := range b.Values {
			if usable(v, false) {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	have := lo <= hi
	l, err := newLayout(c.Width, c.Height, c.Title, c.XLabel, c.YLabel, legendNames(c.Series, func(b Bars) string { return b.Name }))
	if err != nil {
		return err
	}
	ys, err := newScale(lo, hi, have, c.Y, false, l.bot, l.top, true)
	if err != nil {
		return err
	}
	s := &svgWriter{bw: bufio.NewWriter(w)}
	s.header(l, c.Title)
	s.yAxis(l, ys)
	groupW := (l.right - l.left) / float64(len(c.Categories))
	nb := len(c.Series)
	if nb == 0 {
		nb = 1
	}
	barW := groupW * 0.8 / float64(nb)
	// Bars grow from zero, or from the nearest axis edge when zero is
	// outside a fixed range.
	base := ys.px(math.Min(math.Max(0, ys.lo), ys.hi))
	s.printf("<g class=\"xaxis\">\n")
	for k, cat := range c.Categories {
		x := l.left + groupW*(float64(k)+0.5)
		s.printf("<line x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\" stroke=\"#333333\"/>", f(x), f(l.bot), f(x), f(l.bot+5))
		s.printf("<text class=\"tick\" x=\"%s\" y=\"%s\" text-anchor=\"middle\">%s</text>\n", f(x), f(l.bot+18), esc(cat))
	}
	s.printf("</g>\n")
	for i, b := range c.Series {
		s.printf("<g class=\"series\" data-name=\"%s\" clip-path=\"url(#plot-area)\">\n", esc(b.Name))
		for k, v := range b.Values {
			if !usable(v, false) {
				continue
			}
			x := l.left + groupW*float64(k) + groupW*0.1 + barW*float64(i)
			y := ys.px(v)
			top, h := math.Min(y, base), math.Abs(base-y)
			s.printf("<rect class=\"bar\" x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\" fill=\"%s\"><title>%s %s: %s</title></rect>\n",
				f(x), f(top), f(barW), f(h), color(i), esc(b.Name), esc(c.Categories[k]), esc(strconv.FormatFloat(v, 'g', 6, 64)))
		}
		s.printf("</g>\n")
	}
	// Each bar's value above it (below, for a negative one), outside the
	// clip so a bar reaching the top still shows its number.
	s.printf("<g class=\"values\" text-anchor=\"middle\" font-size=\"10\">\n")
	for i, b := range c.Series {
		for k, v := range b.Values {
			if !usable(v, false) {
				continue
			}
			x := l.left + groupW*float64(k) + groupW*0.1 + barW*float64(i) + barW/2
			y := ys.px(v)
			ty := math.Min(y, base) - 3
			if y > base {
				ty = y + 11
			}
			s.printf("<text class=\"value\" x=\"%s\" y=\"%s\">%s</text>\n", f(x), f(ty), esc(strconv.FormatFloat(v, 'g', 3, 64)))
		}
	}
	s.printf("</g>\n")
	if base > l.top && base < l.bot {
		s.printf("<line class=\"zero\" x1=\"%s\" y1=\"%s\" x2=\"%s\" y2=\"%s\" stroke=\"#333333\"/>\n", f(l.left), f(base), f(l.right), f(base))
	}
	if !have {
		s.printf("<text class=\"nodata\" x=\"%s\" y=\"%s\" text-anchor=\"middle\" fill=\"#777777\">no data</text>\n", f((l.left+l.right)/2), f((l.top+l.bot)/2))
	}
	s.frame(l)
	s.labels(l, c.XLabel, c.YLabel)
	s.legend(l, false)
	s.printf("</svg>\n")
	return s.flush()
}
