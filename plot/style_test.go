package plot

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

// Coinciding lines stay apart by dash pattern (legend too), and every bar
// carries its value.
func TestDashesAndBarValues(t *testing.T) {
	var b bytes.Buffer
	same := []float64{1, 2, 3}
	lc := &LineChart{Title: "t", Series: []Series{{Name: "kv", X: same, Y: same}, {Name: "kv+hints", X: same, Y: same}}}
	if err := lc.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	lines := regexp.MustCompile(`<polyline [^>]*>`).FindAllString(b.String(), -1)
	if len(lines) != 2 || strings.Contains(lines[0], "dasharray") || !strings.Contains(lines[1], `stroke-dasharray="7 4"`) {
		t.Fatalf("polylines %q: want the first solid, the second dashed", lines)
	}
	if n := strings.Count(b.String(), `stroke-dasharray="7 4"`); n != 2 {
		t.Fatalf("dash pattern drawn %d times, want line and legend", n)
	}
	b.Reset()
	bc := &BarChart{Title: "hit", Categories: []string{"rr", "kv"}, Series: []Bars{{Name: "hit", Values: []float64{0.1234, 0.261}}}}
	if err := bc.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{">0.123</text>", ">0.261</text>"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no value label %s", want)
		}
	}
}
