package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var twinLastLine = regexp.MustCompile(`^twin: mode=(\S+) requests=(\d+) hit=\d+\.\d{4} reachable=\d+\.\d{4} ttft_p50_ms=\d+\.\d ttft_mean_ms=\d+\.\d wall_s=\d+\.\d{3}$`)

func runTwinCmd(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	cmd := newTwinCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

// TestTwinCompare runs two modes on a trace with one malformed line: the
// line is reported and skipped, each mode's block ends with the summary
// line, and the report files are written.
func TestTwinCompare(t *testing.T) {
	dir := t.TempDir()
	src, err := os.ReadFile("../../twin/testdata/conversation_300.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(src), "\n")[:60]
	lines = append(lines[:10], append([]string{"{not json\n"}, lines[10:]...)...)
	trace := filepath.Join(dir, "t.jsonl")
	if err := os.WriteFile(trace, []byte(strings.Join(lines, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	outDir := filepath.Join(dir, "out")
	out, errOut, err := runTwinCmd(t, "--trace", trace, "--workers", "2", "--compare", "round-robin,kv+hints", "--out", outDir)
	if err != nil {
		t.Fatalf("%v\n%s%s", err, out, errOut)
	}
	if !strings.Contains(errOut, "line 11: invalid JSON") || !strings.Contains(errOut, "(skipped)") {
		t.Fatalf("malformed line not reported:\n%s", errOut)
	}
	var modes []string
	outLines := strings.Split(out, "\n")
	for i, l := range outLines {
		if m := twinLastLine.FindStringSubmatch(l); m != nil {
			modes = append(modes, m[1])
			if m[2] != "60" {
				t.Fatalf("requests in %q", l)
			}
			// The block's next line starts another mode or the table.
			if next := outLines[i+1]; next != "" && !strings.HasPrefix(next, "mode ") {
				t.Fatalf("line after %q: %q", l, next)
			}
		} else if strings.HasPrefix(l, "twin: mode=") {
			t.Fatalf("malformed summary line %q", l)
		}
	}
	if strings.Join(modes, ",") != "round-robin,kv+hints" || !strings.Contains(out, "fetched GiB") {
		t.Fatalf("modes %v; output:\n%s", modes, out)
	}
	for _, f := range []string{"twin.json", "twin_ttft_cdf.svg", "twin_hit_ratio.svg"} {
		if st, err := os.Stat(filepath.Join(outDir, f)); err != nil || st.Size() == 0 {
			t.Fatalf("%s: %v", f, err)
		}
	}

	// --strict fails on the malformed line, naming it.
	_, _, err = runTwinCmd(t, "--trace", trace, "--strict", "--router", "round-robin")
	if err == nil || !strings.Contains(err.Error(), "line 11") {
		t.Fatalf("strict: %v", err)
	}
}

func TestTwinSingleModeEndsWithSummary(t *testing.T) {
	out, _, err := runTwinCmd(t, "--trace", "../../twin/testdata/conversation_300.jsonl", "--requests", "30", "--workers", "2", "--router", "kv", "--concurrency", "4")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if m := twinLastLine.FindStringSubmatch(lines[len(lines)-1]); m == nil || m[1] != "kv" || m[2] != "30" {
		t.Fatalf("last line %q", lines[len(lines)-1])
	}
}

func TestTwinRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"--trace", "../../twin/testdata/conversation_300.jsonl", "--router", "fastest"},
		{"--trace", "../../twin/testdata/conversation_300.jsonl", "--compare", "kv,kv"},
		{"--trace", "../../twin/testdata/conversation_300.jsonl", "--workers", "0", "--requests", "5"},
		{"--trace", "/nonexistent/trace.jsonl"},
	} {
		t.Setenv("KVMESH_TRACE", "")
		if _, _, err := runTwinCmd(t, args...); err == nil {
			t.Fatalf("%q accepted", args)
		}
	}
}

// A cancelled replay (Ctrl-C) says so and names the mode it stopped in.
func TestTwinInterrupted(t *testing.T) {
	t.Setenv("KVMESH_TRACE", "")
	cmd := newTwinCmd()
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"--trace", "../../twin/testdata/conversation_300.jsonl", "--requests", "20", "--workers", "2"})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := cmd.ExecuteContext(ctx)
	if err == nil || err.Error() != "twin: interrupted during mode kv" {
		t.Fatalf("err %v", err)
	}
}

var twinPDLastLine = regexp.MustCompile(`^twin: mode=(\S+) fleet=(\S+) requests=(\d+) disagg=(\d+) local_prefill=(\d+) hit=\d+\.\d{4} reachable=\d+\.\d{4} ttft_p50_ms=\d+\.\d ttft_mean_ms=\d+\.\d itl_p99_ms=\d+\.\d\d wall_s=\d+\.\d{3}$`)

// --fleets compares an aggregated fleet with P/D fleets: each block ends
// with its summary line (P/D ones naming the fleet and the paths), the
// table has a row per fleet, and the report adds the ITL chart.
func TestTwinFleets(t *testing.T) {
	outDir := t.TempDir()
	out, errOut, err := runTwinCmd(t, "--trace", "../../twin/testdata/conversation_300.jsonl", "--requests", "60",
		"--fleets", "4, 2+2,1+3,2+1+1", "--router", "kv", "--out", outDir)
	if err != nil {
		t.Fatalf("%v\n%s%s", err, out, errOut)
	}
	var fleets []string
	for _, l := range strings.Split(out, "\n") {
		if m := twinPDLastLine.FindStringSubmatch(l); m != nil {
			fleets = append(fleets, m[2])
			if m[3] != "60" || m[4] == "0" {
				t.Fatalf("summary %q", l)
			}
		} else if m := twinLastLine.FindStringSubmatch(l); m != nil {
			fleets = append(fleets, "agg")
		} else if strings.HasPrefix(l, "twin: mode=") {
			t.Fatalf("malformed summary line %q", l)
		}
	}
	if strings.Join(fleets, ",") != "agg,2P+2D,1P+3D,2A+1P+1D" || !strings.Contains(out, "fleets 4, 2+2,1+3,2+1+1") ||
		!strings.Contains(out, "local isl") || !strings.Contains(out, "4 agg") {
		t.Fatalf("fleets %v; output:\n%s", fleets, out)
	}
	for _, f := range []string{"twin.json", "twin_ttft_cdf.svg", "twin_hit_ratio.svg", "twin_itl_cdf.svg"} {
		if st, err := os.Stat(filepath.Join(outDir, f)); err != nil || st.Size() == 0 {
			t.Fatalf("%s: %v", f, err)
		}
	}
	js, _ := os.ReadFile(filepath.Join(outDir, "twin.json"))
	if !strings.Contains(string(js), `"local_isl"`) || !strings.Contains(string(js), `"fleets": "4, 2+2,1+3,2+1+1"`) {
		t.Fatalf("report lacks the paths or the fleets:\n%.2000s", js)
	}

	// --prefill-workers/--decode-workers replace the aggregated default.
	out, _, err = runTwinCmd(t, "--trace", "../../twin/testdata/conversation_300.jsonl", "--requests", "20",
		"--prefill-workers", "1", "--decode-workers", "2", "--router", "kv+hints")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if m := twinPDLastLine.FindStringSubmatch(lines[len(lines)-1]); err != nil || m == nil || m[1] != "kv+hints" || m[2] != "1P+2D" {
		t.Fatalf("%v: last line %q", err, lines[len(lines)-1])
	}
}

func TestTwinRejectsBadPDFlags(t *testing.T) {
	tr := "../../twin/testdata/conversation_300.jsonl"
	for _, args := range [][]string{
		{"--prefill-workers", "2"},
		{"--decode-workers", "2"},
		{"--prefill-workers", "1", "--decode-workers", "1", "--disagg-local-prefill-ratio", "0"},
		{"--prefill-workers", "1", "--decode-workers", "1", "--disagg-local-prefill-tokens", "0"},
		{"--fleets", "4,2+"},
		{"--fleets", "0"},
		{"--fleets", "1+0"},
		{"--fleets", "x"},
		{"--fleets", "1+1+1+1"},
	} {
		args = append([]string{"--trace", tr, "--requests", "5"}, args...)
		if _, _, err := runTwinCmd(t, args...); err == nil {
			t.Fatalf("%q accepted", args)
		}
	}
}

// --ladder prints a row per speedup and mode and a capacity line per mode,
// and writes its two charts; its bad values fail with the flag named.
func TestTwinLadder(t *testing.T) {
	const trace = "../../twin/testdata/conversation_300.jsonl"
	outDir := t.TempDir()
	out, _, err := runTwinCmd(t, "--trace", trace, "--requests", "60", "--workers", "2", "--compare", "round-robin,kv",
		"--ladder", "4,1", "--ladder-slo-ms", "1e9", "--out", outDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"twin: capacity mode=round-robin p90_ttft_le_ms=1e+09 max_speedup=4\n",
		"twin: capacity mode=kv p90_ttft_le_ms=1e+09 max_speedup=4\n", "reachable"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "\n"); n != 1+1+4+2 {
		t.Errorf("%d lines:\n%s", n, out)
	}
	for _, f := range []string{"ladder_ttft.svg", "ladder_hit.svg"} {
		if st, err := os.Stat(filepath.Join(outDir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	for args, want := range map[string]string{
		"--ladder 1,x":                   "--ladder: speedup",
		"--ladder 1,1":                   "listed twice",
		"--ladder 1 --arrival-speedup 2": "replaces --arrival-speedup",
		"--ladder 1 --concurrency 4":     "--concurrency",
		"--ladder 1 --ladder-slo-ms 0":   "--ladder-slo-ms 0",
		"--ladder 1 --fleets 2,1+1":      "--fleets",
	} {
		_, _, err := runTwinCmd(t, append([]string{"--trace", trace}, strings.Fields(args)...)...)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", args, err, want)
		}
	}
}
