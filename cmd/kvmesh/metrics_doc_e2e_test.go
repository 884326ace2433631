package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// metricFamilies reads the family names and types of a /metrics page.
func metricFamilies(t *testing.T, url string) map[string]string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	fams := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			fams[f[2]] = f[3]
		}
	}
	return fams
}

var metricName = regexp.MustCompile(`kvmesh_[a-z0-9_]+`)

// optionalSeries are the families a plain `serve --workers N` does not
// export: those of a P/D fleet, of the KVBM connector and of a real
// engine's event relay and KVCR state agent, and the router queue's
// (--router-queue on).
func optionalSeries(name string) bool {
	for _, p := range []string{"kvmesh_disagg_", "kvmesh_kvbm_", "kvmesh_kv_event_relay_", "kvmesh_kvcr_",
		"kvmesh_fleet_disagg_", "kvmesh_fleet_prefill_retries", "kvmesh_router_queue_"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// docs/metrics.md lists every kvmesh_* family a running serve exports and
// nothing it does not (the optional features' series aside); every metric
// the Grafana dashboard queries exists.
func TestMetricsDocAndGrafanaMatchServe(t *testing.T) {
	s := startServe(t, "--workers", "2")
	defer s.stop(t)
	// One request (the labelled frontend series appear with it) and the
	// workers' first load reports (the load series appear with them).
	resp, err := http.Post(s.base+"/chat/completions", "application/json",
		strings.NewReader(`{"model":"kvmesh-sim","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var fams map[string]string
	testutil.WaitFor(t, 10*time.Second, "the per-worker load series", func() bool {
		fams = metricFamilies(t, strings.TrimSuffix(s.base, "/v1")+"/metrics")
		_, ok := fams["kvmesh_fleet_worker_running_requests"]
		return ok
	})
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(kvmesh_[a-z0-9_]+)").FindAllStringSubmatch(string(doc), -1) {
		documented[m[1]] = true
	}
	for name := range fams {
		if strings.HasPrefix(name, "kvmesh_") && !documented[name] {
			t.Errorf("%s is exported but not in docs/metrics.md", name)
		}
	}
	for name := range documented {
		if _, ok := fams[name]; !ok && !optionalSeries(name) {
			t.Errorf("docs/metrics.md lists %s, which serve does not export", name)
		}
	}

	raw, err := os.ReadFile("../../deploy/grafana/kvmesh.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct{ List []struct{ Definition string } }
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("grafana dashboard: %v", err)
	}
	var exprs []string
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		exprs = append(exprs, v.Definition)
	}
	queried := 0
	for _, e := range exprs {
		for _, name := range metricName.FindAllString(e, -1) {
			queried++
			base := name
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(name, suf); ok && fams[b] == "histogram" {
					base = b
				}
			}
			if _, ok := fams[base]; !ok {
				t.Errorf("the Grafana dashboard queries %s, which serve does not export (in %q)", name, e)
			}
		}
	}
	if queried < 20 {
		t.Fatalf("only %d metric references in the dashboard", queried)
	}
}
