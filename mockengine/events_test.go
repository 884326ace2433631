package mockengine

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/events"
	"github.com/kvmesh/kvmesh/kv"
)

type evCollector struct {
	mu   sync.Mutex
	evs  []kv.Event
	dels []events.Delivery
}

func (c *evCollector) handle(d events.Delivery) {
	c.mu.Lock()
	c.evs = append(c.evs, d.Events...)
	c.dels = append(c.dels, d)
	c.mu.Unlock()
}

func (c *evCollector) stored() map[kv.EngineHash]kv.StoredBlock {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[kv.EngineHash]kv.StoredBlock)
	for _, e := range c.evs {
		for _, b := range e.Blocks {
			out[b.EngineHash] = b
		}
	}
	return out
}

func runSubscriber(t *testing.T, cfg events.Config) (*events.Subscriber, *evCollector) {
	t.Helper()
	c := &evCollector{}
	cfg.Handler = c.handle
	cfg.Logger = quiet()
	s, err := events.NewSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("subscriber: %v", err)
		}
	})
	return s, c
}

func eventsConfig(shape events.Shape) *EventsConfig {
	return &EventsConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0",
		BindMode: events.Bind, Topic: "kv@mock", Shape: shape}
}

// TestEventsReachKvmeshSubscriber: a salted prompt's blocks arrive as
// Stored events in the engine's hash domain, with token ids from which
// the subscriber recomputes kvmesh's local hashes (salt included), in
// both encodings.
func TestEventsReachKvmeshSubscriber(t *testing.T) {
	for _, shape := range []events.Shape{events.ShapeMap, events.ShapeArray} {
		t.Run(shape.String(), func(t *testing.T) {
			v, url := startVLLM(t, VLLMConfig{Events: eventsConfig(shape)})
			_, c := runSubscriber(t, events.Config{Endpoint: v.EventsEndpoint(0), ReplayEndpoint: v.ReplayEndpoint(0),
				Topic: "kv@mock", BlockSize: 16})
			prompt := seqTokens(48, 1000)
			local, seqs := kv.NewHasher(16, "", "salt-1").Blocks(prompt)
			// ZMQ drops what a subscriber is not yet connected for; every
			// later batch makes it catch up through the replay socket.
			for i := 0; ; i++ {
				if i > 200 {
					t.Fatal("events never arrived")
				}
				code, b := post(t, url+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1, "cache_salt": "salt-1"}, nil)
				if code != http.StatusOK {
					t.Fatalf("%d %s", code, b)
				}
				if _, ok := c.stored()[EngineHash(seqs[2])]; ok {
					break
				}
				prompt[47]++ // a new last block: a fresh store
				local, seqs = kv.NewHasher(16, "", "salt-1").Blocks(prompt)
				time.Sleep(10 * time.Millisecond)
			}
			got := c.stored()
			for i := range seqs {
				b, ok := got[EngineHash(seqs[i])]
				if !ok || b.LocalHash != local[i] {
					t.Fatalf("block %d: %+v (present %v), want local %x", i, b, ok, local[i])
				}
				if _, wrong := got[kv.EngineHash(seqs[i])]; wrong {
					t.Fatalf("block %d published under kvmesh's sequence hash", i)
				}
			}
		})
	}
}

// TestEventsReplayAfterGap: batches published before anyone listened are
// served by the replay socket, in order.
func TestEventsReplayAfterGap(t *testing.T) {
	v, url := startVLLM(t, VLLMConfig{Events: eventsConfig(events.ShapeMap)})
	for i := range 3 {
		post(t, url+"/v1/completions", map[string]any{"prompt": seqTokens(32, 100*i), "max_tokens": 1}, nil)
	}
	pub := v.pubs.Publisher(0)
	waitFor(t, "three batches", func() bool { return pub.Stats().Batches >= 3 })
	var seqs []uint64
	var stores int
	err := events.FetchReplay(context.Background(), v.ReplayEndpoint(0), 1, 5*time.Second, func(seq uint64, payload []byte) error {
		seqs = append(seqs, seq)
		b, _, err := events.DecodeBatch(payload)
		if err != nil {
			return err
		}
		for _, e := range b.Events {
			if e.Type == events.TypeStored {
				stores++
				if e.BlockSize != 16 || len(e.TokenIDs) != 16*len(e.BlockHashes) || e.Medium != "GPU" {
					t.Errorf("store %+v", e)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seqs) < 2 || seqs[0] != 1 || !slices.IsSorted(seqs) || stores < 2 {
		t.Fatalf("replayed seqs %v, %d stores", seqs, stores)
	}
}
