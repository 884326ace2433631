package remote

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// TestHealthMonitorTransitions: one failed check is tolerated, two in a
// row make the engine unhealthy, one good check makes it healthy again;
// each change closes the channel handed out before it.
func TestHealthMonitorTransitions(t *testing.T) {
	var status atomic.Int32
	status.Store(200)
	var checks atomic.Int32
	var failOnce atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		checks.Add(1)
		if failOnce.CompareAndSwap(true, false) {
			w.WriteHeader(503)
			return
		}
		w.WriteHeader(int(status.Load()))
	}))
	defer srv.Close()
	m := NewHealthMonitor(HealthConfig{URL: srv.URL, Interval: 50 * time.Millisecond})
	defer m.Close()
	wait := func(ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatal(what)
		}
	}
	ok, changed := m.Health()
	if !ok {
		t.Fatal("unhealthy at start")
	}
	status.Store(503)
	wait(changed, "no change to unhealthy")
	if ok, _ := m.Health(); ok || m.Downs() != 1 {
		t.Fatalf("after failing checks: healthy %v, downs %d", ok, m.Downs())
	}
	_, changed = m.Health()
	status.Store(200)
	wait(changed, "no change back to healthy")
	if ok, _ := m.Health(); !ok || m.Downs() != 1 {
		t.Fatalf("after a good check: healthy %v, downs %d", ok, m.Downs())
	}
	// A single failed check in between good ones changes nothing.
	_, changed = m.Health()
	failOnce.Store(true)
	n := checks.Load()
	for failOnce.Load() || checks.Load() < n+4 {
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case <-changed:
		t.Fatal("one failed check changed the verdict")
	default:
	}
}
