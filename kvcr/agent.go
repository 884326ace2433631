package kvcr

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/remote"
	"github.com/kvmesh/kvmesh/events"
	"github.com/kvmesh/kvmesh/kv"
)

// AgentConfig configures a state agent.
type AgentConfig struct {
	// Endpoint is the linker's inventory publisher, tcp://host:port (the
	// agent connects); ReplayEndpoint, when set, its replay socket.
	Endpoint, ReplayEndpoint string
	// Descriptor is what the linker reported; NewAgent validates it
	// against Expect before anything is subscribed.
	Descriptor Descriptor
	Expect     Expect
	Logger     *slog.Logger
}

// AgentStats counts an agent's work.
type AgentStats struct {
	events.Stats
	// Epochs counts inventory resets: each time the linker cleared its
	// inventory or its publisher restarted (a new engine process), the
	// owner's holdings were released and the new epoch's events re-add
	// them. One engine restart may count twice (the sequence starting over
	// and the new linker's own clear).
	Epochs uint64
	// Released counts blocks released at epoch changes.
	Released uint64
	// Held is the blocks the owner holds now, over every tier.
	Held int
}

type heldKey struct {
	w    kv.WorkerKey
	tier kv.Tier
}

// Agent is the state agent for one linker: it takes the linker's
// inventory events and hands them to the worker's event sink as the
// holdings of one cache owner. It tracks what the owner holds, so a new
// epoch (the engine restarted, or the linker re-announces its inventory)
// releases exactly those blocks, tier by tier, instead of clearing the
// worker's other holdings or leaving stale ones beside the re-announced.
type Agent struct {
	cfg  AgentConfig
	log  *slog.Logger
	sub  *events.Subscriber
	feed *remote.Feed

	epochs, released atomic.Uint64

	heldMu sync.Mutex
	held   map[heldKey]map[kv.EngineHash]struct{}
	lost   uint64 // the subscriber's Lost when last looked at
}

// NewAgent validates the descriptor and the endpoints, then prepares the
// subscription; nothing is dialled until the first SetEventSink.
func NewAgent(cfg AgentConfig) (*Agent, error) {
	if err := cfg.Descriptor.Validate(cfg.Expect); err != nil {
		return nil, err
	}
	if _, err := kv.ParseEndpoint(cfg.Endpoint); err != nil {
		return nil, fmt.Errorf("--kvcr-inventory-endpoint: %w", err)
	}
	if cfg.ReplayEndpoint != "" {
		if _, err := kv.ParseEndpoint(cfg.ReplayEndpoint); err != nil {
			return nil, fmt.Errorf("--kvcr-inventory-replay: %w", err)
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	a := &Agent{cfg: cfg, log: cfg.Logger.With("cache_owner", cfg.Descriptor.CacheOwner), held: map[heldKey]map[kv.EngineHash]struct{}{}}
	sub, err := events.NewSubscriber(events.Config{Endpoint: cfg.Endpoint, BindMode: events.Connect, ReplayEndpoint: cfg.ReplayEndpoint,
		Topic: cfg.Descriptor.Topic, Instance: 1, BlockSize: cfg.Expect.BlockSize, Logger: a.log, Handler: a.deliver})
	if err != nil {
		return nil, err
	}
	a.sub = sub
	a.feed = remote.NewFeed(a.log, "kvcr inventory subscription stopped", sub)
	return a, nil
}

// Owner is the cache-owner id the agent holds blocks under.
func (a *Agent) Owner() string { return a.cfg.Descriptor.CacheOwner }

// SetEventSink installs where the owner's events go (the worker's sink;
// nil drops them). The first non-nil sink starts the subscription, so no
// event is taken before someone listens.
func (a *Agent) SetEventSink(s engine.EventSink) { a.feed.SetSink(s) }

// deliver runs on the subscriber's goroutine, one delivery at a time.
func (a *Agent) deliver(d events.Delivery) {
	out := make([]kv.Event, 0, len(d.Events))
	a.heldMu.Lock()
	if lost := a.sub.Stats().Lost; lost > a.lost {
		// Batches are gone for good: what the owner holds may be wrong,
		// so it lets go of everything and rebuilds from here (holding
		// less than KVCR has only costs hits; holding more misroutes).
		a.lost = lost
		a.log.Warn("kvcr inventory batches lost beyond replay; the cache owner's holdings are released and rebuilt from later events", "lost", lost)
		for k := range a.held {
			out = append(out, a.releaseLocked(k.w)...)
		}
	}
	for _, e := range d.Events {
		switch e.Kind {
		case kv.EventCleared:
			out = append(out, a.releaseLocked(e.Worker)...)
			a.epochs.Add(1)
			continue
		case kv.EventStored:
			k := heldKey{e.Worker, e.Tier}
			set := a.held[k]
			if set == nil {
				set = map[kv.EngineHash]struct{}{}
				a.held[k] = set
			}
			for _, b := range e.Blocks {
				set[b.EngineHash] = struct{}{}
			}
		case kv.EventRemoved:
			if set := a.held[heldKey{e.Worker, e.Tier}]; set != nil {
				for _, h := range e.Removed {
					delete(set, h)
				}
			}
		}
		out = append(out, e)
	}
	a.heldMu.Unlock()
	if len(out) == 0 {
		return
	}
	a.feed.Send(out)
}

// releaseLocked removes everything the owner holds on w's rank, one
// Removed event per tier.
func (a *Agent) releaseLocked(w kv.WorkerKey) []kv.Event {
	var out []kv.Event
	for t := range kv.Tier(kv.NumTiers) {
		k := heldKey{w, t}
		set := a.held[k]
		if len(set) == 0 {
			continue
		}
		hs := make([]kv.EngineHash, 0, len(set))
		for h := range set {
			hs = append(hs, h)
		}
		a.released.Add(uint64(len(hs)))
		out = append(out, kv.Removed(w, t, hs))
		delete(a.held, k)
	}
	return out
}

// Stats returns the counters.
func (a *Agent) Stats() AgentStats {
	a.heldMu.Lock()
	n := 0
	for _, set := range a.held {
		n += len(set)
	}
	a.heldMu.Unlock()
	return AgentStats{Stats: a.sub.Stats(), Epochs: a.epochs.Load(), Released: a.released.Load(), Held: n}
}

// Close stops the subscription.
func (a *Agent) Close() error {
	a.feed.Close()
	return nil
}
