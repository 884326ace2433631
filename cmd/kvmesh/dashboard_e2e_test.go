package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// browserPath finds a Chromium-family browser for chromedp; without one the
// test skips, unless KVMESH_REQUIRE_TOOLS=1 (CI, which installs chromium).
func browserPath(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	missingTool(t, "no headless browser (chromium) on PATH: the dashboard's browser test needs one (Debian: apt-get install chromium)")
	return ""
}

// The dashboard in a real headless browser: it loads with no console
// error, lists every worker of a running serve, and its numbers move while
// bench load drives traffic. The screenshot (taken during the load) is
// saved to $KVMESH_DASHBOARD_SCREENSHOT or the temp dir, path logged.
func TestDashboardInBrowser(t *testing.T) {
	browser := browserPath(t)
	const workers = 3
	s := startServe(t, "--workers", fmt.Sprint(workers), "--speedup-ratio", "20", "--router-queue", "on")
	defer s.stop(t)
	root := strings.TrimSuffix(s.base, "/v1")

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox,
		chromedp.WindowSize(1400, 900), chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-dev-shm-usage", true))
	// Chromium now and then dies while starting on a loaded machine
	// (before it prints its DevTools address): start it again, a few times.
	var ctx context.Context
	for attempt := 1; ; attempt++ {
		actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
		bctx, cancel := chromedp.NewContext(actx)
		err := chromedp.Do(bctx)
		if err == nil {
			defer cancelAlloc()
			defer cancel()
			ctx = bctx
			break
		}
		cancel()
		cancelAlloc()
		if attempt == 3 {
			t.Fatalf("starting chromium, %d tries: %v", attempt, err)
		}
		t.Logf("chromium did not start (try %d): %v", attempt, err)
		time.Sleep(time.Second)
	}
	ctx, cancelT := context.WithTimeout(ctx, 60*time.Second)
	defer cancelT()

	var mu sync.Mutex
	var consoleErrs []string
	listen := func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch e := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledTypeError || e.Type == runtime.ConsoleAPICalledTypeWarning {
				var args []string
				for _, a := range e.Args {
					args = append(args, string(a.Value))
				}
				consoleErrs = append(consoleErrs, fmt.Sprintf("console.%s %s", e.Type, strings.Join(args, " ")))
			}
		case *runtime.EventExceptionThrown:
			consoleErrs = append(consoleErrs, fmt.Sprintf("exception: %s %+v", e.ExceptionDetails.Text, e.ExceptionDetails.Exception))
		case *log.EventEntryAdded:
			if e.Entry.Level == log.EntryLevelError || e.Entry.Level == log.EntryLevelWarning {
				consoleErrs = append(consoleErrs, fmt.Sprintf("log %s: %s %s", e.Entry.Level, e.Entry.Text, e.Entry.URL))
			}
		}
	}
	if err := chromedp.Listen(ctx, listen); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, log.Enable, cdp.Empty{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, runtime.Enable, cdp.Empty{}); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(root+"/dashboard")); err != nil {
		t.Fatal(err)
	}
	text := func(sel string) string {
		s, err := chromedp.Run(ctx, chromedp.Text(sel))
		if err != nil {
			t.Fatalf("%s: %v", sel, err)
		}
		return s
	}
	testutil.WaitFor(t, 20*time.Second, "every worker in the table", func() bool {
		rows, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#workers tbody tr td.ready").length`))
		return err == nil && rows == workers
	})
	before := text("#req-total")

	// Traffic: a short shared-prefix bench load, in-process.
	load := newBenchLoadCmd()
	var loadOut bytes.Buffer
	load.SetOut(&loadOut)
	load.SetErr(&bytes.Buffer{})
	load.SetArgs([]string{"--url", s.base, "--synthetic", "--groups", "4", "--prompts-per-group", "60", "--system-len", "1024",
		"--question-len", "64", "--output-len", "64", "--concurrency", "8"})
	loadDone := make(chan error, 1)
	go func() { loadDone <- load.ExecuteContext(context.Background()) }()

	testutil.WaitFor(t, 30*time.Second, "the dashboard's numbers to move under load", func() bool {
		hit := text("#hit")
		return text("#req-total") != before && hit != "–" && hit != "0.0 %"
	})
	// The charts draw the polls over time: request rate, TTFT and the hit
	// ratio each have a line through several points of this load.
	drawn := func() map[string]int {
		pts, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]int](`Object.fromEntries([...document.querySelectorAll("figure.chart")]
			.filter(f => !f.hidden && f.querySelector("svg polyline"))
			.map(f => [f.id, Number(f.dataset.points || 0)]))`))
		if err != nil {
			t.Fatal(err)
		}
		return pts
	}
	testutil.WaitFor(t, 30*time.Second, "the charts to draw the load", func() bool {
		pts := drawn()
		return pts["chart-requests"] >= 3 && pts["chart-ttft"] >= 3 && pts["chart-hit"] >= 3
	})
	// A second of polls for the rates and percentiles of a busy interval.
	time.Sleep(1500 * time.Millisecond)
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	path := os.Getenv("KVMESH_DASHBOARD_SCREENSHOT")
	if path == "" {
		path = filepath.Join(os.TempDir(), "kvmesh-dashboard.png")
	}
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("dashboard screenshot: %s (%d bytes)", path, len(shot))
	if err := <-loadDone; err != nil {
		t.Fatalf("bench load: %v\n%s", err, loadOut.String())
	}
	if pts := drawn(); len(pts) < 3 {
		t.Errorf("charts with lines: %v, want at least 3", pts)
	}
	if legend := text("#chart-hit .legend"); !strings.Contains(legend, "achieved") || !strings.Contains(legend, "predicted") || strings.Contains(legend, "achieved –") {
		t.Errorf("hit ratio chart legend: %q", legend)
	}
	// The router queue (serve --router-queue on) beside the engines'
	// queues; routing regret per model, its line the served model's.
	if legend := text("#chart-queue .legend"); !strings.Contains(legend, "waiting on engines") || !strings.Contains(legend, "in the router queue") || strings.Contains(legend, "seconds") {
		t.Errorf("queue chart legend: %q", legend)
	}
	// Regret has a point for each poll whose interval routed a reachable
	// prefix: at least one during the load, however fast it ran.
	if pts := drawn(); pts["chart-regret"] < 1 {
		t.Errorf("routing regret chart: %v points, want at least 1", pts["chart-regret"])
	}
	if legend := text("#chart-regret .legend"); legend == "" || strings.Contains(legend, "–") {
		t.Errorf("routing regret chart legend: %q", legend)
	}
	if r := text("#router"); !regexp.MustCompile(`prefix routed / reachable \(\S+\)\s*\d+\.\d %`).MatchString(r) || !strings.Contains(r, "in the router queue now") {
		t.Errorf("router panel without the regret or the queue: %q", r)
	}
	time.Sleep(1500 * time.Millisecond) // a poll after the load's last request
	workerReqs, err := chromedp.Run(ctx, chromedp.Evaluate[int](`(() => {
		const col = [...document.querySelectorAll("#workers thead th")].findIndex(th => th.textContent === "requests");
		return [...document.querySelectorAll("#workers tbody tr")].reduce((n, tr) => n + Number(tr.children[col].textContent.replace(/,/g, "")), 0);
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	if workerReqs < 240 {
		t.Errorf("the workers table shows %d requests after a load of 240", workerReqs)
	}
	// Router decisions by mode and path, and the router's credit by tier:
	// the shared prefixes were found on the workers' devices.
	if d := text("#decisions"); !strings.Contains(d, "kv · aggregated") {
		t.Errorf("decisions by mode and path: %q", d)
	}
	// Every planned hint is accounted: the hints panel's ledger balances
	// once the load's last streams ended.
	ledger := regexp.MustCompile(`hints planned = delivered \+ dropped \+ failed\s*([\d,]+) = ([\d,]+) \+ ([\d,]+) \+ ([\d,]+)`)
	var row string
	testutil.WaitFor(t, 10*time.Second, "the hint ledger to balance", func() bool {
		row = text("#transfers")
		m := ledger.FindStringSubmatch(row)
		if m == nil {
			return false
		}
		n := make([]int, 4)
		for i := range n {
			n[i], _ = strconv.Atoi(strings.ReplaceAll(m[i+1], ",", ""))
		}
		return n[0] == n[1]+n[2]+n[3]
	}, func() string { return row })
	// Beside it, what the workers actually served, by tier: from the device.
	for _, head := range []string{"credited by tier", "hits by tier"} {
		col, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(() => {
		const col = [...document.querySelectorAll("#workers thead th")].findIndex(th => th.textContent === "`+head+`");
		return col < 0 ? "no column" : [...document.querySelectorAll("#workers tbody tr")].map(tr => tr.children[col].textContent).join(" | ");
	})()`))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(col, "D ") {
			t.Errorf("no device share in the workers table's %q column: %q", head, col)
		}
	}
	// A panel per concept, hidden when unused: this fleet's workers take
	// hints and serve peers (serve's default --hints), but it has no P/D,
	// no host or disk tiers and no real engines.
	panels := func() map[string]bool {
		vis, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]bool](`Object.fromEntries([...document.querySelectorAll(".panel")].map(p => [p.id, !p.hidden && p.offsetHeight > 0]))`))
		if err != nil {
			t.Fatal(err)
		}
		return vis
	}
	if vis := panels(); !vis["panel-router"] || !vis["panel-hints"] || vis["panel-pd"] || vis["panel-tiers"] || vis["panel-engines"] {
		t.Errorf("panels shown for an aggregated sim fleet: %v", vis)
	}
	// Readable in a dark room: under prefers-color-scheme dark the page
	// turns dark, with light text.
	colors := `[getComputedStyle(document.body).backgroundColor, getComputedStyle(document.body).color].join(" ")`
	light, err := chromedp.Run(ctx, chromedp.Evaluate[string](colors))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
		Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}}}); err != nil {
		t.Fatal(err)
	}
	dark, err := chromedp.Run(ctx, chromedp.Evaluate[string](colors))
	if err != nil {
		t.Fatal(err)
	}
	if light != "rgb(247, 247, 245) rgb(27, 29, 33)" || dark != "rgb(15, 17, 21) rgb(230, 232, 235)" {
		t.Errorf("colours (background, text): light %q, dark %q", light, dark)
	}

	// A P/D fleet (whose workers serve their blocks to peers) shows the P/D
	// and transfer panels.
	pd := startServe(t, "--prefill-workers", "1", "--decode-workers", "1", "--speedup-ratio", "20")
	defer pd.stop(t)
	if err := chromedp.Do(ctx, chromedp.Navigate(strings.TrimSuffix(pd.base, "/v1")+"/dashboard")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "the P/D panel", func() bool {
		vis := panels()
		return vis["panel-pd"] && vis["panel-hints"] && !vis["panel-tiers"]
	})
	if w := text("#pd"); !strings.Contains(w, "1 / 1 / 0") {
		t.Errorf("P/D panel: %q", w)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(consoleErrs) > 0 {
		t.Fatalf("console errors:\n%s", strings.Join(consoleErrs, "\n"))
	}
}
