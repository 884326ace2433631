package natsbus_test

import (
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/natsbus"
	"github.com/kvmesh/kvmesh/natsbus/natstest"
)

func TestMain(m *testing.M) { natstest.Main(m) }

func TestBroadcastSkipsSelf(t *testing.T) {
	e := natstest.Start(t)
	type msg struct{ from, data string }
	var mu sync.Mutex
	recv := map[string][]msg{}
	peers := map[string]*natsbus.Broadcast{}
	var conns []*nats.Conn
	for _, id := range []string{"r1", "r2", "r3"} {
		nc := natstest.Connect(t, e.URL())
		conns = append(conns, nc)
		b, err := natsbus.NewBroadcast(nc, natsbus.SyncSubject("m", "active"), id, func(from string, data []byte) {
			mu.Lock()
			recv[id] = append(recv[id], msg{from, string(data)})
			mu.Unlock()
		})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		peers[id] = b
	}
	for _, nc := range conns {
		nc.Flush() // every subscription is on the server
	}
	if err := peers["r1"].Publish([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "r2 and r3 receive", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(recv["r2"]) == 1 && len(recv["r3"]) == 1 && recv["r2"][0] == msg{"r1", "hello"}
	})
	time.Sleep(50 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(recv["r1"]) != 0 {
		t.Fatalf("sender received its own message: %v", recv["r1"])
	}
}
