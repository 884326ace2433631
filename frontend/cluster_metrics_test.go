package frontend

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/runtime"
)

// The cluster puts each model's event-feed counters on its registry and
// takes them off at Close, so a new cluster can use the same registry.
func TestClusterFeedMetrics(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*ats).start"))
	srv, err := runtime.StartEmbedded(runtime.EmbeddedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := runtime.Connect(runtime.ConnConfig{URLs: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	disc, err := runtime.OpenDiscovery(ctx, nc, runtime.DiscoveryConfig{TTL: time.Second, Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	open := func() *Cluster {
		c, err := NewCluster(ctx, ClusterConfig{NC: nc, Discovery: disc, Models: []*Model{{Name: "a"}, {Name: "b"}},
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
	if c.Feed("a") == nil || c.Feed("nope") != nil {
		t.Fatal("Feed: wrong feeds")
	}
	c.Close()
	if n := feedSeries(); n != 0 {
		t.Fatalf("%d feed series after Close", n)
	}
	open().Close()
}
