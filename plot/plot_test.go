package plot

import (
	"bytes"
	"encoding/xml"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// svgStats parses doc as XML and counts what the tests look at.
type svgStats struct {
	series, bars, circles, polylines, legendItems int
	names                                         []string
	texts                                         []string
	root                                          string
}

func parseSVG(t *testing.T, doc []byte) svgStats {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(doc))
	var st svgStats
	depth := 0
	inLegend := 0
	var text *strings.Builder
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("invalid XML: %v\n%s", err, doc)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			depth++
			if depth == 1 {
				st.root = e.Name.Local
				if e.Name.Space != "http://www.w3.org/2000/svg" {
					t.Fatalf("root namespace %q", e.Name.Space)
				}
			}
			class := ""
			for _, a := range e.Attr {
				if a.Name.Local == "class" {
					class = a.Value
				}
			}
			switch {
			case e.Name.Local == "g" && class == "series":
				st.series++
				for _, a := range e.Attr {
					if a.Name.Local == "data-name" {
						st.names = append(st.names, a.Value)
					}
				}
			case e.Name.Local == "g" && class == "legend":
				inLegend = depth
			case e.Name.Local == "rect" && class == "bar":
				st.bars++
			case e.Name.Local == "circle":
				st.circles++
			case e.Name.Local == "polyline":
				st.polylines++
			case e.Name.Local == "text":
				text = &strings.Builder{}
				if inLegend > 0 {
					st.legendItems++
				}
			}
		case xml.CharData:
			if text != nil {
				text.Write(e)
			}
		case xml.EndElement:
			if e.Name.Local == "text" && text != nil {
				st.texts = append(st.texts, text.String())
				text = nil
			}
			if depth == inLegend {
				inLegend = 0
			}
			depth--
		}
	}
	if st.root != "svg" {
		t.Fatalf("root element %q, want svg", st.root)
	}
	return st
}

func render(t *testing.T, c Chart) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := c.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

func TestCDFChart(t *testing.T) {
	a := CDF("kv <router>", []float64{30, 10, 20, math.NaN(), 40})
	if len(a.X) != 4 || a.X[0] != 10 || a.X[3] != 40 || a.Y[0] != 0.25 || a.Y[3] != 1 {
		t.Fatalf("CDF = %+v", a)
	}
	b := CDF("round robin", []float64{15, 25, 35})
	c := CDFChart("TTFT & friends", "TTFT (ms)", a, b)
	doc := render(t, c)
	st := parseSVG(t, doc)
	if st.series != 2 || st.polylines != 2 || st.legendItems != 2 {
		t.Fatalf("series=%d polylines=%d legend=%d", st.series, st.polylines, st.legendItems)
	}
	if st.names[0] != "kv <router>" || st.names[1] != "round robin" {
		t.Fatalf("names %q", st.names)
	}
	for _, want := range []string{"TTFT & friends", "TTFT (ms)", "fraction ≤ x", "0.0", "1.0", "kv <router>"} {
		if !contains(st.texts, want) {
			t.Errorf("missing text %q in %q", want, st.texts)
		}
	}
	if !bytes.Equal(doc, render(t, c)) {
		t.Fatal("output not deterministic")
	}
	// A step CDF has two vertices per point.
	if n := strings.Count(string(doc), ","); n < 2*4+2*3 {
		t.Fatalf("only %d vertices", n)
	}
}

func TestLineChartStylesAndLog(t *testing.T) {
	s := Series{Name: "latency", X: []float64{0, 1, 2, 3}, Y: []float64{1, 10, 100, 0}}
	for _, tc := range []struct {
		style          Style
		circles, polys int
	}{{Lines, 0, 1}, {Points, 4, 0}, {LinesPoints, 4, 1}} {
		st := parseSVG(t, render(t, &LineChart{Series: []Series{s}, Style: tc.style}))
		if st.circles != tc.circles || st.polylines != tc.polys || st.series != 1 {
			t.Errorf("style %d: circles=%d polylines=%d series=%d", tc.style, st.circles, st.polylines, st.series)
		}
	}
	// On a log y axis the zero is skipped and ticks are powers of ten.
	st := parseSVG(t, render(t, &LineChart{Series: []Series{s}, Style: Points, LogY: true}))
	if st.circles != 3 {
		t.Fatalf("log axis kept %d points, want 3", st.circles)
	}
	for _, want := range []string{"1", "10", "100"} {
		if !contains(st.texts, want) {
			t.Errorf("log ticks %q lack %q", st.texts, want)
		}
	}
}

func TestLineChartTicksAreNice(t *testing.T) {
	st := parseSVG(t, render(t, &LineChart{XLabel: "t (s)", Series: []Series{{X: []float64{0.3, 97}, Y: []float64{12000, 47000}}}}))
	for _, want := range []string{"0", "20", "100", "10k", "50k"} {
		if !contains(st.texts, want) {
			t.Errorf("ticks %q lack %q", st.texts, want)
		}
	}
	if st.legendItems != 0 {
		t.Errorf("one unnamed series got a legend")
	}
}

func TestEmptyAndDegenerateCharts(t *testing.T) {
	st := parseSVG(t, render(t, &LineChart{Title: "nothing"}))
	if !contains(st.texts, "no data") {
		t.Fatal("empty chart does not say so")
	}
	st = parseSVG(t, render(t, &LineChart{Series: []Series{{Name: "one", X: []float64{5}, Y: []float64{5}}}, Style: Points}))
	if st.circles != 1 {
		t.Fatalf("single point: %d circles", st.circles)
	}
	st = parseSVG(t, render(t, &LineChart{Series: []Series{{Name: "inf", X: []float64{math.Inf(1)}, Y: []float64{1}}}}))
	if !contains(st.texts, "no data") {
		t.Fatal("non-finite only series is not 'no data'")
	}
}

func TestInvalidInputs(t *testing.T) {
	for name, c := range map[string]Chart{
		"xy mismatch":   &LineChart{Series: []Series{{X: []float64{1}, Y: nil}}},
		"bad style":     &LineChart{Style: Style(9)},
		"tiny":          &LineChart{Width: 10, Height: 10},
		"empty range":   &LineChart{X: Range{2, 2}},
		"log nonpos":    &LineChart{LogX: true, X: Range{0, 10}},
		"no categories": &BarChart{},
		"bar mismatch":  &BarChart{Categories: []string{"a", "b"}, Series: []Bars{{Name: "x", Values: []float64{1}}}},
	} {
		if err := c.WriteSVG(io.Discard); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestBarChartGrouped(t *testing.T) {
	c := &BarChart{
		Title: "hit ratio", YLabel: "ratio",
		Categories: []string{"4 workers", "8 workers", "16 workers"},
		Series: []Bars{
			{Name: "random", Values: []float64{0.19, 0.13, 0.09}},
			{Name: "prefix", Values: []float64{0.37, 0.37, math.NaN()}},
		},
	}
	doc := render(t, c)
	st := parseSVG(t, doc)
	if st.series != 2 || st.bars != 5 || st.legendItems != 2 {
		t.Fatalf("series=%d bars=%d legend=%d", st.series, st.bars, st.legendItems)
	}
	for _, want := range []string{"8 workers", "hit ratio", "ratio", "0.0"} {
		if !contains(st.texts, want) {
			t.Errorf("missing %q", want)
		}
	}
	if !bytes.Equal(doc, render(t, c)) {
		t.Fatal("not deterministic")
	}
	// Negative values grow down from a visible zero line.
	doc = render(t, &BarChart{Categories: []string{"a", "b"}, Series: []Bars{{Name: "d", Values: []float64{-3, 5}}}})
	parseSVG(t, doc)
	if !strings.Contains(string(doc), `class="zero"`) {
		t.Fatal("no zero line with negative bars")
	}
}

func TestWriteFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.svg")
	if err := WriteFile(p, CDFChart("x", "ms", CDF("a", []float64{1, 2, 3}))); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	parseSVG(t, b)
	if err := WriteFile(p, &BarChart{}); err == nil {
		t.Fatal("invalid chart written")
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatal("failed write removed the previous file")
	}
	if err := WriteFile(filepath.Join(t.TempDir(), "missing", "c.svg"), &LineChart{}); err == nil {
		t.Fatal("write into a missing folder succeeded")
	}
}

func TestEscapesControlCharacters(t *testing.T) {
	st := parseSVG(t, render(t, &LineChart{Title: "a\x01b\"'<&", Series: []Series{{Name: "\x00", X: []float64{1}, Y: []float64{1}}}}))
	// Control characters become U+FFFD; markup characters survive escaping.
	if !slices.Contains(st.texts, "a\uFFFDb\"'<&") {
		t.Errorf("title not found escaped in texts %q", st.texts)
	}
	if !slices.Equal(st.names, []string{"\uFFFD"}) {
		t.Errorf("series names %q, want [\"\\uFFFD\"]", st.names)
	}
}

func BenchmarkLineChart10k(b *testing.B) {
	x := make([]float64, 10000)
	y := make([]float64, 10000)
	for i := range x {
		x[i], y[i] = float64(i), float64(i%97)
	}
	c := &LineChart{Series: []Series{{Name: "s", X: x, Y: y}}, Style: Points}
	for b.Loop() {
		if err := c.WriteSVG(io.Discard); err != nil {
			b.Fatal(err)
		}
	}
}
