package testutil

import (
	"net/http/httptest"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func testRegistry(t *testing.T) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "req_total"}, []string{"status", "model"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "inflight"})
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "lat_seconds", Buckets: []float64{1}}, []string{"scope"})
	reg.MustRegister(c, g, h)
	c.WithLabelValues("200", "m").Add(3)
	c.WithLabelValues("503", "m").Add(2)
	c.WithLabelValues("200", `a "b"`).Add(1)
	g.Set(4)
	h.WithLabelValues("fetch").Observe(0.5)
	h.WithLabelValues("fetch").Observe(2)
	return reg
}

// The registry and its /metrics text read into the same series.
func TestMetricsAndScrapeAgree(t *testing.T) {
	reg := testRegistry(t)
	want := map[string]float64{
		`req_total{model="m",status="200"}`:       3,
		`req_total{model="m",status="503"}`:       2,
		`req_total{model="a \"b\"",status="200"}`: 1,
		`inflight`:                         4,
		`lat_seconds_count{scope="fetch"}`: 2,
		`lat_seconds_sum{scope="fetch"}`:   2.5,
	}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	for name, got := range map[string]map[string]float64{"Metrics": Metrics(t, reg), "Scrape": Scrape(t, srv.URL)} {
		if len(got) != len(want) {
			t.Errorf("%s: %d series %v, want %d", name, len(got), got, len(want))
		}
		for k, v := range want {
			if g, ok := got[k]; !ok || g != v {
				t.Errorf("%s: %s = %v (present %v), want %v", name, k, g, ok, v)
			}
		}
	}
}

func TestValueSumsMatchingSeries(t *testing.T) {
	reg := testRegistry(t)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"req_total", nil, 6},
		{"req_total", []string{"status", "200"}, 4},
		{"req_total", []string{"status", "200", "model", "m"}, 3},
		{"req_total", []string{"status", "404"}, 0},
		{"lat_seconds_count", []string{"scope", "fetch"}, 2},
		{"nope", nil, 0},
	} {
		if got := Value(t, reg, c.name, c.labels...); got != c.want {
			t.Errorf("Value(%s, %v) = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

func TestWaitForPollsUntilTrue(t *testing.T) {
	n := 0
	WaitFor(t, time.Minute, "three polls", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("cond called %d times", n)
	}
}

func TestProc(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	p := Start(t, "script", sh, []string{"GREETING=hello"}, "-c",
		`echo noise; echo "ready a=1 b=$GREETING"; echo oops >&2; exec sleep 60`)
	line, err := p.WaitLine("ready", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if f := Fields(line); f["a"] != "1" || f["b"] != "hello" {
		t.Fatalf("fields of %q: %v", line, f)
	}
	WaitFor(t, time.Minute, "stderr", func() bool { return strings.Contains(p.Stderr(), "oops") })
	if err := p.Stop(syscall.SIGTERM, time.Minute); err == nil || !strings.Contains(err.Error(), "terminated") {
		t.Fatalf("Stop: %v, want killed by SIGTERM", err)
	}
	if _, err := p.WaitMatch(regexp.MustCompile("never"), time.Minute); err == nil || !strings.Contains(err.Error(), "exited") {
		t.Fatalf("WaitMatch after exit: %v", err)
	}
}
