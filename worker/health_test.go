package worker

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/natsbus"
)

// healthEngine is a testEngine whose health the test sets (engine.Health).
type healthEngine struct {
	*testEngine
	mu      sync.Mutex
	down    bool
	changed chan struct{}
}

func (e *healthEngine) Health() (bool, <-chan struct{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return !e.down, e.changed
}

func (e *healthEngine) set(healthy bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.down = !healthy
	close(e.changed)
	e.changed = make(chan struct{})
}

// An unhealthy engine takes its worker out of discovery, fails its open
// stream and new calls Unavailable, and reports not ok; healthy again, the
// worker registers again and serves. Each transition is counted once.
func TestEngineHealthTransitions(t *testing.T) {
	_, nc := startNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d := memDiscovery(t, ctx, nc)
	wt, err := d.Watch(ctx, "m", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer wt.Close()
	reg := prometheus.NewRegistry()
	eng := &healthEngine{testEngine: &testEngine{tick: 10 * time.Millisecond}, changed: make(chan struct{})}
	w, c := startWorkerWith(t, nc, eng, Config{Registerer: reg})
	l := fmt.Sprintf(`{instance="%s",model="m"}`, natsbus.InstanceToken(w.InstanceID()))
	testutil.WaitFor(t, 10*time.Second, "worker discovered", func() bool { return len(wt.Instances()) == 1 })

	st, err := c.Generate(ctx, &api.GenerateRequest{Tokens: prompt(1, 8), MaxTokens: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	eng.set(false)
	for err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("open stream on an unhealthy engine ended with %v, want Unavailable", err)
	}
	testutil.WaitFor(t, 10*time.Second, "worker out of discovery", func() bool { return len(wt.Instances()) == 0 })
	st, err = c.Generate(ctx, &api.GenerateRequest{Tokens: prompt(2, 8), MaxTokens: 2})
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("new call on an unhealthy engine: %v, want Unavailable", err)
	}
	if h, err := c.Health(ctx, &api.HealthRequest{}); err != nil || h.Ok {
		t.Fatalf("worker health with its engine unhealthy: %v %v", h, err)
	}
	m := testutil.Metrics(t, reg)
	if m["kvmesh_worker_engine_unhealthy_total"+l] != 1 || m["kvmesh_worker_healthy"+l] != 0 {
		t.Fatalf("unhealthy_total %v healthy %v", m["kvmesh_worker_engine_unhealthy_total"+l], m["kvmesh_worker_healthy"+l])
	}

	eng.set(true)
	testutil.WaitFor(t, 10*time.Second, "worker back in discovery", func() bool { return len(wt.Instances()) == 1 })
	st, err = c.Generate(ctx, &api.GenerateRequest{Tokens: prompt(3, 8), MaxTokens: 3})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		ch, err := st.Recv()
		if err != nil {
			break
		}
		n += len(ch.Tokens)
	}
	if n != 3 {
		t.Fatalf("%d tokens after recovery, want 3", n)
	}
	m = testutil.Metrics(t, reg)
	if m["kvmesh_worker_engine_unhealthy_total"+l] != 1 || m["kvmesh_worker_healthy"+l] != 1 {
		t.Fatalf("after recovery: unhealthy_total %v healthy %v", m["kvmesh_worker_engine_unhealthy_total"+l], m["kvmesh_worker_healthy"+l])
	}
	// Close deregisters for good: no comeback from a late verdict.
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "closed worker out of discovery", func() bool { return len(wt.Instances()) == 0 })
}
