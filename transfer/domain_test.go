package transfer

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kv"
)

// A source serves a fetch only the blocks stored in the fetch's own salt
// domain: knowing another tenant's hashes is not enough to read them.
func TestServerKeepsSaltDomains(t *testing.T) {
	a, b := kv.Seed("", "tenant-a"), kv.Seed("", "tenant-b")
	src := NewMemSource(2, 64)
	src.Add(1, 2)              // unsalted
	src.AddInDomain(a, 11, 12) // tenant a's chain
	src.AddInDomain(b, 21)     // tenant b's
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	ep := startServer(t, &Server{Source: src, Metrics: m})
	c := NewClient(ClientOptions{})
	defer c.Close()
	for _, tc := range []struct {
		name   string
		hashes []uint64
		domain uint64
		want   int
		refuse float64 // salt_domain refusals this fetch adds
	}{
		{"unsalted reads unsalted", []uint64{1, 2}, 0, 2, 0},
		{"base seed is the unsalted domain", []uint64{1, 2}, kv.BaseSeed, 2, 0},
		{"a reads a", []uint64{11, 12}, a, 2, 0},
		{"b cannot read a", []uint64{11, 12}, b, 0, 1},
		{"unsalted cannot read a", []uint64{11, 12}, 0, 0, 1},
		{"a cannot read unsalted", []uint64{1, 2}, a, 0, 1},
		{"a mixed chain ends where the domain changes", []uint64{11, 21}, a, 1, 1},
	} {
		before := testutil.Value(t, reg, "kvmesh_transfer_refused_total", "reason", "salt_domain")
		res, err := c.Fetch(context.Background(), ep, FetchRequest{Hashes: tc.hashes, Domain: tc.domain})
		if err != nil && tc.want > 0 {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if res.Completed != tc.want {
			t.Errorf("%s: got %d blocks (%v), want %d", tc.name, res.Completed, res.Outcome, tc.want)
		}
		if tc.want == 0 && res.Outcome != OutcomeNotFound {
			t.Errorf("%s: outcome %v, want not found", tc.name, res.Outcome)
		}
		after := testutil.Value(t, reg, "kvmesh_transfer_refused_total", "reason", "salt_domain")
		if after-before != tc.refuse {
			t.Errorf("%s: %v salt-domain refusals counted, want %v", tc.name, after-before, tc.refuse)
		}
		res.Release()
	}
	testutil.WaitFor(t, 10*time.Second, "pins released", func() bool { return src.Pins() == 0 })
}
