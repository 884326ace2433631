package check

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const promDir = "../prometheus"

func kubernetesJob(t *testing.T) ScrapeJob {
	t.Helper()
	c, err := LoadScrapeConfig(filepath.Join(promDir, "kubernetes-pods.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.ScrapeConfigs) != 1 || len(c.ScrapeConfigs[0].KubernetesSDConfigs) != 1 {
		t.Fatalf("want one kubernetes_sd job, got %+v", c.ScrapeConfigs)
	}
	return c.ScrapeConfigs[0]
}

func TestStaticScrapeConfigDecodes(t *testing.T) {
	c, err := LoadScrapeConfig(filepath.Join(promDir, "static.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.ScrapeConfigs) != 2 {
		t.Fatalf("jobs %+v, want frontend and worker", c.ScrapeConfigs)
	}
}

func TestScrapeConfigRejectsTypos(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(promDir, "kubernetes-pods.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte(strings.Replace(string(b), "target_label:", "targetlabel:", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadScrapeConfig(bad); err == nil || !strings.Contains(err.Error(), "unknown field") {
		t.Fatalf("a misspelt key decoded: %v", err)
	}
}

// TestRelabelSemantics pins the simulation to Prometheus's documented
// behaviour: anchored regexes, "$1" default replacement, ";" joining.
func TestRelabelSemantics(t *testing.T) {
	s := func(v string) *string { return &v }
	in := map[string]string{"__address__": "10.1.2.3:9000", "a": "x", "b": "y"}
	got, err := Relabel(in, []RelabelConfig{
		{SourceLabels: []string{"a", "b"}, TargetLabel: "ab"},                                        // "x;y"
		{SourceLabels: []string{"a"}, Regex: s("(x|z)"), TargetLabel: "anchored"},                    // matches the whole value
		{SourceLabels: []string{"ab"}, Regex: s("."), Replacement: s("never"), TargetLabel: "short"}, // "x;y" is not one character
		{SourceLabels: []string{"__address__"}, Regex: s(`(.+?)(?::\d+)?`), Replacement: s("$1:80"), TargetLabel: "__address__"},
		{SourceLabels: []string{"missing"}, Regex: s("(.*)"), TargetLabel: "b"}, // empty result deletes
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"__address__": "10.1.2.3:80", "a": "x", "ab": "x;y", "anchored": "x"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	if r, _ := Relabel(in, []RelabelConfig{{SourceLabels: []string{"a"}, Regex: s("xx"), Action: "keep"}}); r != nil {
		t.Error("keep with a non-matching (anchored) regex kept the target")
	}
}

// TestKubernetesScrapeFindsKvmeshPods runs the scrape job's relabelling over
// the pods the chart renders: each frontend and worker group is one target
// on its metrics port and path, NATS is not scraped.
func TestKubernetesScrapeFindsKvmeshPods(t *testing.T) {
	job := kubernetesJob(t)
	docs := mustRender(t, valueSets["pd"]...)
	targets, err := ScrapeTargets(job, docs, "kvmesh", "10.0.0.7")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range targets {
		got = append(got, s.URL+" "+s.Labels["component"]+" "+s.Labels["role"])
	}
	slices.Sort(got)
	want := []string{
		"http://10.0.0.7:8000/metrics frontend ",
		"http://10.0.0.7:9090/metrics worker decode",
		"http://10.0.0.7:9090/metrics worker prefill",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("targets\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Without the annotations nothing is scraped: the job keys on them.
	docs = mustRender(t, append(valueSets["pd"], "--set", "metrics.podAnnotations=false")...)
	if targets, _ := ScrapeTargets(job, docs, "kvmesh", "10.0.0.7"); len(targets) != 0 {
		t.Fatalf("targets without annotations: %+v", targets)
	}
}
