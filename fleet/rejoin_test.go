package fleet

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/router"
)

// A request that finds no worker right after the model lost its last one
// waits for discovery to list one again (as after a NATS restart, when
// every record expires at once) and is routed then; a model that never had
// a worker, a window that lapsed, a negative window or a cancelled request
// fail at once.
func TestAwaitRejoin(t *testing.T) {
	in := discovery.Instance{ID: 9, Model: "m", Role: "aggregated", GRPCAddr: "127.0.0.1:1", DPSize: 1, BlockSize: 16}
	setup := func(t *testing.T) (*instances, func() (kv.TokenStream, error), *int) {
		tab, r := newTestTable(t)
		calls := 0
		gen := func() (kv.TokenStream, error) {
			calls++
			d, err := r.Route(context.Background(), router.Request{Model: "m", Tokens: make([]uint32, 32)})
			if err != nil {
				return nil, err
			}
			d.Done()
			return nil, nil
		}
		return tab, gen, &calls
	}
	t.Run("rejoins", func(t *testing.T) {
		tab, gen, calls := setup(t)
		tab.apply(discovery.Event{Kind: discovery.InstanceAdded, Instance: in}, nil)
		tab.apply(discovery.Event{Kind: discovery.InstanceRemoved, Instance: in}, nil)
		// The worker comes back 50ms after the first try failed, however
		// late that try runs.
		tried := make(chan struct{})
		try := func() (kv.TokenStream, error) {
			st, err := gen()
			if *calls == 1 {
				close(tried)
			}
			return st, err
		}
		go func() {
			<-tried
			time.Sleep(50 * time.Millisecond)
			tab.apply(discovery.Event{Kind: discovery.InstanceAdded, Instance: in}, nil)
		}()
		start := time.Now()
		if _, err := awaitRejoin(context.Background(), tab, "m", 5*time.Second, try); err != nil {
			t.Fatalf("after the worker re-registered: %v", err)
		}
		if d := time.Since(start); d < 40*time.Millisecond || d > 3*time.Second || *calls != 2 {
			t.Errorf("routed after %v in %d tries, want ~50ms and 2", d, *calls)
		}
	})
	t.Run("never had one", func(t *testing.T) {
		tab, gen, calls := setup(t)
		if _, err := awaitRejoin(context.Background(), tab, "m", 5*time.Second, gen); !errors.Is(err, kv.ErrNoWorkers) || *calls != 1 {
			t.Fatalf("%v after %d tries, want ErrNoWorkers at once", err, *calls)
		}
	})
	t.Run("window lapses", func(t *testing.T) {
		tab, gen, _ := setup(t)
		tab.apply(discovery.Event{Kind: discovery.InstanceAdded, Instance: in}, nil)
		start := time.Now() // before the removal the window counts from
		tab.apply(discovery.Event{Kind: discovery.InstanceRemoved, Instance: in}, nil)
		if _, err := awaitRejoin(context.Background(), tab, "m", 100*time.Millisecond, gen); !errors.Is(err, kv.ErrNoWorkers) {
			t.Fatalf("%v, want ErrNoWorkers", err)
		}
		if d := time.Since(start); d < 100*time.Millisecond || d > 3*time.Second {
			t.Errorf("gave up after %v, want the ~100ms window", d)
		}
		// "At once" is well under the window a wait would take (5 s), with
		// room for a loaded machine.
		tab.now = func() time.Time { return time.Now().Add(time.Minute) }
		start = time.Now()
		if _, err := awaitRejoin(context.Background(), tab, "m", 5*time.Second, gen); !errors.Is(err, kv.ErrNoWorkers) || time.Since(start) > time.Second {
			t.Fatalf("after the window: %v in %v, want ErrNoWorkers at once", err, time.Since(start))
		}
	})
	t.Run("off or cancelled", func(t *testing.T) {
		tab, gen, _ := setup(t)
		tab.apply(discovery.Event{Kind: discovery.InstanceAdded, Instance: in}, nil)
		tab.apply(discovery.Event{Kind: discovery.InstanceRemoved, Instance: in}, nil)
		start := time.Now()
		if _, err := awaitRejoin(context.Background(), tab, "m", -1, gen); !errors.Is(err, kv.ErrNoWorkers) || time.Since(start) > time.Second {
			t.Fatalf("negative window: %v in %v", err, time.Since(start))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if _, err := awaitRejoin(ctx, tab, "m", 5*time.Second, gen); !errors.Is(err, kv.ErrNoWorkers) || time.Since(start) > 3*time.Second {
			t.Fatalf("cancelled: %v after %v", err, time.Since(start))
		}
	})
}
