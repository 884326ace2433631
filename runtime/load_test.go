package runtime

import (
	"context"
	"sync"
	"testing"
	"time"
)

func TestLoadReports(t *testing.T) {
	e := startNATS(t)
	nc := connect(t, e.URL())
	var mu sync.Mutex
	got := map[uint64]LoadReport{}
	bad := 0
	sub, err := SubscribeLoad(nc, "m", func(r LoadReport) {
		mu.Lock()
		got[r.Instance] = r
		mu.Unlock()
	}, func(error) { mu.Lock(); bad++; mu.Unlock() })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		RunLoadPublisher(ctx, connect(t, e.URL()), "m", 20*time.Millisecond, func() []LoadReport {
			return []LoadReport{{Instance: 0x42, UsedBlocks: 3, TotalBlocks: 10, Running: 1}}
		}, nil)
	}()
	nc.Publish(LoadSubject("m", 0x43), []byte("nope"))
	nc.Publish(LoadSubject("m", 0x44), []byte(`{"instance_id":1}`))
	eventually(t, 5*time.Second, "load report", func() bool {
		mu.Lock()
		defer mu.Unlock()
		r, ok := got[0x42]
		return ok && r.UsedBlocks == 3 && r.TotalBlocks == 10 && r.UnixNano != 0 && bad == 2 && len(got) == 1
	})
	cancel()
	<-done
}

func TestBroadcastSkipsSelf(t *testing.T) {
	e := startNATS(t)
	type msg struct{ from, data string }
	var mu sync.Mutex
	recv := map[string][]msg{}
	peers := map[string]*Broadcast{}
	for _, id := range []string{"r1", "r2", "r3"} {
		b, err := NewBroadcast(connect(t, e.URL()), SyncSubject("m", "active"), id, func(from string, data []byte) {
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
	for _, b := range peers {
		b.nc.Flush()
	}
	if err := peers["r1"].Publish([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "r2 and r3 receive", func() bool {
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
