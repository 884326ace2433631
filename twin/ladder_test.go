package twin

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

func TestParseLadder(t *testing.T) {
	got, err := ParseLadder("4, 1,2.5")
	if err != nil || len(got) != 3 || got[0] != 1 || got[1] != 2.5 || got[2] != 4 {
		t.Fatalf("ParseLadder: %v, %v", got, err)
	}
	for _, bad := range []string{"", "1,,2", "0", "-1", "x", "inf", "NaN", "2,2"} {
		if _, err := ParseLadder(bad); err == nil {
			t.Errorf("ParseLadder(%q) succeeded", bad)
		}
	}
}

var capacityLine = regexp.MustCompile(`^twin: capacity mode=(\S+) p90_ttft_le_ms=(\S+) max_speedup=(\S+)$`)

// TestLadderSlice climbs the 300-request slice on 4 workers: the fast
// steps overload them, so the SLO splits the ladder, and each
// capacity line names the highest step within it.
func TestLadderSlice(t *testing.T) {
	wl := loadSlice(t)
	modes := []string{"round-robin", "kv"}
	speedups := []float64{1, 4, 16}
	l, err := RunLadder(context.Background(), wl, Config{Workers: 4, Seed: 3}, modes, speedups, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Put the SLO between the fastest and slowest steps of kv, so one
	// step at least falls on each side.
	var lo, hi float64
	for i := range speedups {
		p := l.Results[i][1].TTFT.P90
		if i == 0 || p < lo {
			lo = p
		}
		hi = max(hi, p)
	}
	if !(hi > 2*lo) {
		t.Fatalf("kv p90 TTFT %v … %v: the ladder does not load the fleet", lo, hi)
	}
	l.SLOMS = (lo + hi) / 2
	for i, sp := range speedups {
		for j, r := range l.Results[i] {
			checkResult(t, r)
			if r.Mode != modes[j] || r.Offered != 300 {
				t.Fatalf("step %g column %d: mode %s offered %d", sp, j, r.Mode, r.Offered)
			}
			// Reachable is what the index showed at routing time; a queued
			// request may find more by the time it is scheduled, not much.
			if r.Reachable+1e-9 < r.Hit.Device-0.05 || r.Reachable > 1 {
				t.Errorf("step %g %s: reachable %.4f against hit %.4f", sp, r.Mode, r.Reachable, r.Hit.Device)
			}
		}
	}
	var b bytes.Buffer
	if err := l.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 1+len(speedups)*len(modes)+len(modes) {
		t.Fatalf("table:\n%s", b.String())
	}
	for j, m := range modes {
		want := 0.0
		for i, sp := range speedups {
			if l.Results[i][j].TTFT.P90 <= l.SLOMS {
				want = sp
			}
		}
		mm := capacityLine.FindStringSubmatch(lines[1+len(speedups)*len(modes)+j])
		if mm == nil || mm[1] != m || mm[3] != strconv.FormatFloat(want, 'g', -1, 64) || l.MaxSpeedup(j) != want {
			t.Errorf("capacity line %q, want mode %s max_speedup %g", lines[1+len(speedups)*len(modes)+j], m, want)
		}
	}
	if l.MaxSpeedup(1) == 0 || l.MaxSpeedup(1) == speedups[len(speedups)-1] {
		t.Errorf("kv max speedup %g with the SLO inside its range", l.MaxSpeedup(1))
	}
	dir := t.TempDir()
	paths, err := l.WriteCharts(dir)
	if err != nil || len(paths) != 2 {
		t.Fatalf("charts %v: %v", paths, err)
	}
	for _, name := range []string{LadderTTFTSVG, LadderHitSVG} {
		svg, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || !bytes.Contains(svg, []byte("round-robin")) || !bytes.Contains(svg, []byte("kv")) {
			t.Errorf("%s: %v, %d bytes", name, err, len(svg))
		}
	}
	if _, err := RunLadder(context.Background(), wl, Config{Concurrency: 4}, modes, speedups, 1000, nil); err == nil {
		t.Error("a closed-loop ladder ran")
	}
}
