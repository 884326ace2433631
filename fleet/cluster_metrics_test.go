package fleet

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/router"
)

// The cluster puts each model's event-feed counters on its registry and
// takes them off at Close, so a new cluster can use the same registry.
func TestClusterFeedMetrics(t *testing.T) {
	ctx, nc, disc := controlPlane(t, time.Second)
	reg := prometheus.NewRegistry()
	open := func() *Cluster {
		c, err := New(ctx, Config{NC: nc, Discovery: disc, Models: []string{"a", "b"},
			Router: router.Config{Mode: router.ModeKV}, Logger: slog.New(slog.DiscardHandler), Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	feedSeries := func() (n int) {
		for k := range gatherMetrics(t, reg) {
			if strings.HasPrefix(k, "kvmesh_event_feed_batches_total{") {
				n++
			}
		}
		return n
	}
	c := open()
	if n := feedSeries(); n != 2 {
		t.Fatalf("%d feed batch series, want one per model", n)
	}
	if c.feeds["a"] == nil || c.feeds["nope"] != nil {
		t.Fatal("Feed: wrong feeds")
	}
	c.Close()
	if n := feedSeries(); n != 0 {
		t.Fatalf("%d feed series after Close", n)
	}
	open().Close()
}
