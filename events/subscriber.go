package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvmesh/kvmesh/kv"
)

// Config configures a Subscriber for one publisher (one vLLM DP rank: vLLM
// gives every rank its own PUB socket and sequence; see RankEndpoint).
type Config struct {
	Endpoint       string        // the publisher's PUB endpoint
	BindMode       BindMode      // default BindAuto: connect unless the endpoint is bind-style
	ReplayEndpoint string        // the publisher's ROUTER replay endpoint; empty: gaps are only counted
	Topic          string        // topic prefix; "" receives all
	Instance       uint64        // kv.WorkerKey.Instance of the delivered events
	BlockSize      int           // the worker's block size; 0 trusts block_size on the wire
	DPRank         uint32        // rank for batches that carry none
	ReplayTimeout  time.Duration // bound on one replay exchange; default 2 s
	Logger         *slog.Logger
	// Handler receives every applied batch, in sequence order, on the
	// subscriber's goroutine; it owns what it gets and should return soon.
	Handler func(d Delivery)
}

// Delivery is one applied batch.
type Delivery struct {
	Seq      uint64
	Replayed bool   // fetched through the replay socket
	Batch    *Batch // the decoded wire batch; nil for synthetic events (restart)
	Events   []kv.Event
}

// Stats counts a subscriber's work and every kind of trouble it survived.
type Stats struct {
	Batches         uint64 // batches applied (live and replayed)
	Events          uint64 // kv events delivered
	Replayed        uint64 // batches applied from replay
	Duplicates      uint64 // batches dropped as already applied
	Gaps            uint64 // sequence gaps detected after the first batch
	Lost            uint64 // sequence numbers neither live nor replay could supply
	Malformed       uint64 // payloads that failed to decode
	BadFrames       uint64 // messages without 3 frames or an 8-byte seq
	UnknownEvents   uint64 // events with unknown tags, skipped
	DroppedEvents   uint64 // events conversion dropped (unknown medium, remote, no full block, duplicate hashes)
	UnknownMedia    uint64 // of DroppedEvents: events whose medium names no tier
	TruncatedStores uint64 // stores cut at a short or mismatched block
	ReplayRequests  uint64
	ReplayErrors    uint64
	Restarts        uint64 // publisher sequence went backwards
}

// Subscriber consumes one vLLM/SGLang KV-event publisher.
type Subscriber struct {
	cfg  Config
	log  *slog.Logger
	conv Converter

	// Owned by the Run goroutine.
	started  bool
	next     uint64 // next sequence number to apply
	haveLive bool
	lastLive uint64
	joining  bool // first catch-up: history older than the ring is not a loss
	ranks    map[uint32]struct{}

	running atomic.Bool
	stats   struct {
		batches, events, replayed, duplicates, gaps, lost, malformed, badFrames,
		unknown, replayReq, replayErr, restarts atomic.Uint64
	}
	convMu sync.Mutex // guards conv.Stats for Stats()
}

// NewSubscriber validates cfg.
func NewSubscriber(cfg Config) (*Subscriber, error) {
	if cfg.Endpoint == "" {
		return nil, errors.New("events subscriber: no endpoint")
	}
	if cfg.Handler == nil {
		return nil, errors.New("events subscriber: no handler")
	}
	if cfg.BlockSize < 0 {
		return nil, fmt.Errorf("events subscriber: block size %d", cfg.BlockSize)
	}
	if cfg.ReplayTimeout <= 0 {
		cfg.ReplayTimeout = 2 * time.Second
	}
	s := &Subscriber{cfg: cfg, log: cfg.Logger, ranks: make(map[uint32]struct{})}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.log = s.log.With("endpoint", cfg.Endpoint)
	s.conv = Converter{Instance: cfg.Instance, BlockSize: cfg.BlockSize, DPRank: cfg.DPRank}
	return s, nil
}

// Stats returns the counters.
func (s *Subscriber) Stats() Stats {
	s.convMu.Lock()
	cs := s.conv.Stats
	s.convMu.Unlock()
	return Stats{
		Batches: s.stats.batches.Load(), Events: s.stats.events.Load(), Replayed: s.stats.replayed.Load(),
		Duplicates: s.stats.duplicates.Load(), Gaps: s.stats.gaps.Load(), Lost: s.stats.lost.Load(),
		Malformed: s.stats.malformed.Load(), BadFrames: s.stats.badFrames.Load(), UnknownEvents: s.stats.unknown.Load(),
		DroppedEvents: cs.Dropped, UnknownMedia: cs.UnknownMedia, TruncatedStores: cs.Truncated, ReplayRequests: s.stats.replayReq.Load(),
		ReplayErrors: s.stats.replayErr.Load(), Restarts: s.stats.restarts.Load(),
	}
}

// Run subscribes and applies batches until ctx ends; it then returns nil.
// It returns an error only when the socket cannot be set up. Run may be
// called once.
func (s *Subscriber) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("events subscriber: Run called twice")
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sock := zmq4.NewSub(sctx, zmq4.WithAutomaticReconnect(true),
		zmq4.WithDialerRetry(100*time.Millisecond), zmq4.WithDialerMaxRetries(-1))
	defer sock.Close()
	if err := sock.SetOption(zmq4.OptionSubscribe, s.cfg.Topic); err != nil {
		return fmt.Errorf("events subscriber: subscribe %q: %w", s.cfg.Topic, err)
	}
	// Dial retries until the publisher is up or ctx ends.
	if _, err := attach(sock, s.cfg.Endpoint, s.cfg.BindMode); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("events subscriber: %w", err)
	}
	msgs := make(chan zmq4.Msg, 1024)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			m, err := sock.Recv()
			if sctx.Err() != nil {
				return
			}
			if err != nil {
				// A dropped connection surfaces as an error here; the socket
				// reconnects on its own.
				s.log.Debug("kv event receive", "err", err)
				select {
				case <-sctx.Done():
					return
				case <-time.After(20 * time.Millisecond):
				}
				continue
			}
			select {
			case msgs <- m:
			case <-sctx.Done():
				return
			}
		}
	}()
	defer wg.Wait()
	defer cancel()
	s.catchUp(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-msgs:
			s.handleLive(ctx, m)
		}
	}
}

// catchUp asks the replay socket, before any live batch, for everything
// the publisher still buffers (vLLM answers from its oldest buffered seq),
// so a subscriber that joins a warm, idle engine learns its cache at once
// rather than at the engine's next event. Live batches that arrive
// meanwhile wait and are deduplicated against it. When the socket gives
// nothing (unreachable, empty ring), the first live batch starts the
// stream as before.
func (s *Subscriber) catchUp(ctx context.Context) {
	if s.cfg.ReplayEndpoint == "" || s.started {
		return
	}
	s.started, s.joining, s.next = true, true, 0
	s.replay(ctx)
	s.joining = false
	if s.next == 0 {
		s.started = false
		return
	}
	s.log.Info("kv event stream caught up at start", "next_seq", s.next)
}

func (s *Subscriber) handleLive(ctx context.Context, m zmq4.Msg) {
	if len(m.Frames) != 3 {
		s.stats.badFrames.Add(1)
		s.log.Warn("kv event message dropped", "frames", len(m.Frames), "want", 3)
		return
	}
	seq, ok := seqOf(m.Frames[1])
	if !ok {
		s.stats.badFrames.Add(1)
		s.log.Warn("kv event message dropped", "seq_bytes", len(m.Frames[1]), "want", 8)
		return
	}
	s.Ingest(ctx, seq, m.Frames[2])
}

// Ingest processes one live (seq, payload) pair as if it came off the PUB
// socket: gap repair, dedup, decode, convert, deliver. Run calls it; it is
// exported for engines that hand over their stream some other way. Not safe
// for concurrent use with Run.
func (s *Subscriber) Ingest(ctx context.Context, seq uint64, payload []byte) {
	if s.haveLive && seq <= s.lastLive {
		// PUB streams never go backwards: the publisher restarted, and its
		// cache with it.
		s.stats.restarts.Add(1)
		s.log.Warn("kv event publisher restarted", "seq", seq, "last", s.lastLive)
		s.clearAll(seq)
		s.next, s.started = 0, false
	}
	s.haveLive, s.lastLive = true, seq
	if !s.started {
		s.started = true
		if s.cfg.ReplayEndpoint == "" {
			s.next = seq // joined late, nothing to catch up with
		}
		// Otherwise next is 0: catch up on what the ring still holds.
		s.joining = true
	}
	if seq > s.next {
		if !s.joining {
			s.stats.gaps.Add(1)
		}
		s.replay(ctx)
		if seq > s.next {
			s.lose(seq)
		}
	}
	s.joining = false
	if seq < s.next {
		s.stats.duplicates.Add(1)
		return
	}
	if s.apply(seq, payload, false) {
		return
	}
	// Re-sync through replay: a corrupt live copy may have a good twin in
	// the ring. Skip it when none comes.
	s.replay(ctx)
	if s.next == seq {
		s.next = seq + 1
	}
}

func (s *Subscriber) lose(upTo uint64) {
	n := upTo - s.next
	if s.joining {
		s.log.Info("kv event stream joined", "seq", upTo, "older_batches_unavailable", n)
		s.next = upTo
		return
	}
	s.stats.lost.Add(n)
	s.log.Warn("kv event batches lost", "from", s.next, "to", upTo-1, "count", n)
	s.next = upTo
}

// replay fetches batches from s.next on and applies them in order.
func (s *Subscriber) replay(ctx context.Context) {
	if s.cfg.ReplayEndpoint == "" || ctx.Err() != nil {
		return
	}
	s.stats.replayReq.Add(1)
	err := FetchReplay(ctx, s.cfg.ReplayEndpoint, s.next, s.cfg.ReplayTimeout, func(seq uint64, payload []byte) error {
		if seq < s.next {
			s.stats.duplicates.Add(1)
			return nil
		}
		if seq > s.next {
			s.lose(seq) // older than the ring
		}
		if !s.apply(seq, payload, true) {
			s.next = seq + 1
		}
		return nil
	})
	if err != nil && ctx.Err() == nil {
		s.stats.replayErr.Add(1)
		s.log.Warn("kv event replay failed", "from", s.next, "err", err)
	}
}

// apply decodes, converts and delivers one batch; false if it is malformed.
func (s *Subscriber) apply(seq uint64, payload []byte, replayed bool) bool {
	b, st, err := DecodeBatch(payload)
	if st.UnknownEvents > 0 {
		s.stats.unknown.Add(uint64(st.UnknownEvents))
		s.log.Warn("kv events with unknown tags skipped", "seq", seq, "count", st.UnknownEvents)
	}
	if err != nil {
		s.stats.malformed.Add(1)
		s.log.Warn("malformed kv event batch", "seq", seq, "replayed", replayed, "bytes", len(payload), "err", err)
		return false
	}
	s.next = seq + 1
	s.convMu.Lock()
	evs := s.conv.Convert(nil, b)
	s.convMu.Unlock()
	s.ranks[s.conv.Worker(b).DPRank] = struct{}{}
	s.stats.batches.Add(1)
	if replayed {
		s.stats.replayed.Add(1)
	}
	s.stats.events.Add(uint64(len(evs)))
	s.cfg.Handler(Delivery{Seq: seq, Replayed: replayed, Batch: b, Events: evs})
	return true
}

// clearAll delivers a Cleared event for every rank seen so far.
func (s *Subscriber) clearAll(seq uint64) {
	if len(s.ranks) == 0 {
		return
	}
	var evs []kv.Event
	s.convMu.Lock()
	for r := range s.ranks {
		w := kv.WorkerKey{Instance: s.cfg.Instance, DPRank: r}
		e := kv.Cleared(w)
		e.ID = s.conv.NextID(w)
		evs = append(evs, e)
	}
	s.convMu.Unlock()
	s.stats.events.Add(uint64(len(evs)))
	s.cfg.Handler(Delivery{Seq: seq, Events: evs})
}
