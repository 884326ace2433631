package remote

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/events"
	"github.com/kvmesh/kvmesh/kv"
)

// RelayConfig configures a Relay: one engine, DPSize ranks, each
// publishing on its own port (rank r on Endpoint's port + r, as vLLM
// derives it; replay likewise).
type RelayConfig struct {
	Endpoint       string // rank 0's PUB endpoint, tcp://host:port
	ReplayEndpoint string // rank 0's ROUTER replay endpoint; "" leaves gaps unrepaired
	Topic          string
	DPSize         int // default 1
	// BlockSize is the worker's block size: local hashes are cut at it,
	// and a store the engine reports with another block_size is an error
	// (logged once, counted, the store dropped).
	BlockSize int
	Logger    *slog.Logger
}

// RelayStats counts a relay's work, summed over ranks.
type RelayStats struct {
	events.Stats
	// Cleared counts holdings cleared because batches were lost beyond
	// what replay could supply.
	Cleared uint64
	// BlockSizeMismatches counts stores whose block_size is not the
	// worker's.
	BlockSizeMismatches uint64
}

// Relay subscribes to an engine's KV events and hands them, converted to
// kv events (local hashes recomputed from token ids, engine hashes kept),
// to the worker's sink. Gaps are repaired through replay; a gap replay
// cannot fill clears the rank's holdings (the index would be wrong
// otherwise) and the following events rebuild them.
type Relay struct {
	cfg  RelayConfig
	log  *slog.Logger
	subs []*events.Subscriber
	lost []uint64 // per rank, owned by that rank's subscriber goroutine
	feed *Feed
	held []rankState

	cleared, mismatch atomic.Uint64
	lostWarned        atomic.Bool
	mismatchWarned    atomic.Bool
}

// rankState is what one rank's relayed events built; its lock is held
// while they reach the sink, so a listing of it matches the worker's event
// log exactly.
type rankState struct {
	mu       sync.Mutex
	holdings *rankHoldings
}

// NewRelay validates cfg and prepares one subscriber per rank; nothing is
// dialled until Start.
func NewRelay(cfg RelayConfig) (*Relay, error) {
	if cfg.DPSize <= 0 {
		cfg.DPSize = 1
	}
	if cfg.BlockSize <= 0 {
		return nil, fmt.Errorf("kv event relay: block size %d", cfg.BlockSize)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Relay{cfg: cfg, log: cfg.Logger, lost: make([]uint64, cfg.DPSize), held: make([]rankState, cfg.DPSize)}
	for i := range r.held {
		r.held[i].holdings = newRankHoldings()
	}
	for rank := range cfg.DPSize {
		ep, err := events.RankEndpoint(cfg.Endpoint, rank)
		if err != nil {
			return nil, fmt.Errorf("kv events endpoint: %w", err)
		}
		var rep string
		if cfg.ReplayEndpoint != "" {
			if rep, err = events.RankEndpoint(cfg.ReplayEndpoint, rank); err != nil {
				return nil, fmt.Errorf("kv events replay endpoint: %w", err)
			}
		}
		sub, err := events.NewSubscriber(events.Config{Endpoint: ep, BindMode: events.Connect, ReplayEndpoint: rep,
			Topic: cfg.Topic, Instance: 1, BlockSize: cfg.BlockSize, DPRank: uint32(rank), Logger: cfg.Logger,
			Handler: func(d events.Delivery) { r.deliver(rank, d) }})
		if err != nil {
			return nil, err
		}
		r.subs = append(r.subs, sub)
	}
	r.feed = NewFeed(r.log, "kv event relay stopped", r.subs...)
	return r, nil
}

// SetSink installs where events go (nil drops them). The first non-nil
// sink starts the subscribers, so no event is relayed before someone
// listens: with a replay endpoint, the relay then catches up on what the
// engine still buffers.
func (r *Relay) SetSink(s engine.EventSink) { r.feed.SetSink(s) }

// deliver runs on rank's subscriber goroutine.
func (r *Relay) deliver(rank int, d events.Delivery) {
	if b := d.Batch; b != nil {
		for i := range b.Events {
			ev := &b.Events[i]
			if ev.Type == events.TypeStored && ev.BlockSize != 0 && ev.BlockSize != r.cfg.BlockSize {
				r.mismatch.Add(1)
				if r.mismatchWarned.CompareAndSwap(false, true) {
					r.log.Error("kv events: the engine stores blocks of a different size than this worker's block size; those stores are dropped (set --block-size to the engine's)",
						"engine_block_size", ev.BlockSize, "block_size", r.cfg.BlockSize, "rank", rank)
				}
			}
		}
	}
	evs := d.Events
	if lost := r.subs[rank].Stats().Lost; lost > r.lost[rank] {
		// Batches are gone for good: what the index holds for this rank
		// may be wrong, so it starts over from here.
		r.lost[rank] = lost
		r.cleared.Add(1)
		if r.lostWarned.CompareAndSwap(false, true) {
			r.log.Warn("kv event batches lost beyond replay; the worker's holdings are cleared and rebuilt from later events (logged once)", "rank", rank, "lost", lost)
		}
		evs = append([]kv.Event{kv.Cleared(kv.WorkerKey{DPRank: uint32(rank)})}, evs...)
	}
	if len(evs) == 0 {
		return
	}
	for i := range evs {
		evs[i].Worker.DPRank = uint32(rank)
	}
	st := &r.held[rank]
	st.mu.Lock()
	defer st.mu.Unlock()
	st.holdings.apply(evs)
	r.feed.Send(evs)
}

// Inventory lists what rank holds according to its relayed events, as
// Stored events (engine.Inventory); at runs while the list matches the
// events handed to the sink.
func (r *Relay) Inventory(rank int, at func()) ([]kv.Event, bool) {
	if rank < 0 || rank >= len(r.held) {
		return nil, false
	}
	st := &r.held[rank]
	st.mu.Lock()
	defer st.mu.Unlock()
	evs := st.holdings.list(kv.WorkerKey{DPRank: uint32(rank)})
	if at != nil {
		at()
	}
	return evs, true
}

// Stats sums the ranks' counters.
func (r *Relay) Stats() RelayStats {
	var out RelayStats
	for _, s := range r.subs {
		st := s.Stats()
		o := &out.Stats
		o.Batches += st.Batches
		o.Events += st.Events
		o.Replayed += st.Replayed
		o.Duplicates += st.Duplicates
		o.Gaps += st.Gaps
		o.Lost += st.Lost
		o.Malformed += st.Malformed
		o.BadFrames += st.BadFrames
		o.UnknownEvents += st.UnknownEvents
		o.DroppedEvents += st.DroppedEvents
		o.UnknownMedia += st.UnknownMedia
		o.TruncatedStores += st.TruncatedStores
		o.ReplayRequests += st.ReplayRequests
		o.ReplayErrors += st.ReplayErrors
		o.Restarts += st.Restarts
	}
	out.Cleared = r.cleared.Load()
	out.BlockSizeMismatches = r.mismatch.Load()
	return out
}

// Close stops the subscribers.
func (r *Relay) Close() error {
	r.feed.Close()
	return nil
}
