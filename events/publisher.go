package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvmesh/kvmesh/kv"
)

// PublisherConfig configures a vLLM-wire publisher. Defaults follow vLLM.
type PublisherConfig struct {
	Endpoint       string   // PUB endpoint; default "tcp://*:5557"
	BindMode       BindMode // default BindAuto (vLLM's rule)
	ReplayEndpoint string   // ROUTER endpoint for replay; empty disables replay. Always binds.
	Topic          string
	Shape          Shape // ShapeArray (classic) by default
	BufferSteps    int   // replay ring length in batches; default 10,000
	HWM            int   // PUB queue high-water mark; default 100,000
	// BlockSize is written as block_size; 0 derives it from each event.
	BlockSize int
	// SignedHashes writes block hashes as signed int64, as SGLang does.
	SignedHashes bool
	Logger       *slog.Logger
	Now          func() time.Time // ts source; default time.Now
}

// PublisherStats counts a publisher's work.
type PublisherStats struct {
	Batches        uint64 // batches published (= next sequence number)
	Events         uint64
	EncodeErrors   uint64
	ReplayRequests uint64
	ReplayBad      uint64 // malformed replay requests
	ReplayBatches  uint64 // batches re-sent through replay
}

type ringEntry struct {
	seq     uint64
	payload []byte
}

// Publisher publishes kv events on vLLM's wire: a PUB socket sending
// (topic, seq, payload) and an optional ROUTER socket replaying the last
// BufferSteps batches. Publish is safe for concurrent use; the wire order is
// the sequence order.
type Publisher struct {
	cfg      PublisherConfig
	log      *slog.Logger
	pub      zmq4.Socket
	replay   zmq4.Socket
	endpoint string
	replayEP string
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	mu     sync.Mutex // orders seq assignment, ring and sends
	enc    *Encoder
	seq    uint64
	ring   []ringEntry // circular, len ≤ BufferSteps
	head   int         // index of the oldest entry once the ring is full
	closed bool

	events, encErr, replayReq, replayBad, replayed atomic.Uint64

	// liveFrame, when set (tests), replaces the payload sent on PUB for a
	// seq: nil drops the live copy; the ring keeps the real one.
	liveFrame func(seq uint64, payload []byte) []byte
}

// NewPublisher opens the sockets. ctx bounds the sockets' lifetime; Close
// releases them.
func NewPublisher(ctx context.Context, cfg PublisherConfig) (*Publisher, error) {
	if cfg.Endpoint == "" {
		cfg.Endpoint = "tcp://*:5557"
	}
	if cfg.BufferSteps <= 0 {
		cfg.BufferSteps = 10_000
	}
	if cfg.HWM <= 0 {
		cfg.HWM = 100_000
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	p := &Publisher{cfg: cfg, log: cfg.Logger, enc: NewEncoder()}
	p.enc.SignedHashes = cfg.SignedHashes
	if p.log == nil {
		p.log = slog.Default()
	}
	ctx, p.cancel = context.WithCancel(ctx)
	p.pub = zmq4.NewPub(ctx)
	if err := p.pub.SetOption(zmq4.OptionHWM, cfg.HWM); err != nil {
		p.cancel()
		_ = p.pub.Close()
		return nil, fmt.Errorf("events publisher: set HWM: %w", err)
	}
	var err error
	if p.endpoint, err = attach(p.pub, cfg.Endpoint, cfg.BindMode); err != nil {
		p.cancel()
		_ = p.pub.Close()
		return nil, fmt.Errorf("events publisher: %w", err)
	}
	if cfg.ReplayEndpoint != "" {
		p.replay = zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity("kvmesh-replay")))
		if p.replayEP, err = attach(p.replay, cfg.ReplayEndpoint, Bind); err != nil {
			p.cancel()
			_ = p.pub.Close()
			_ = p.replay.Close()
			return nil, fmt.Errorf("events publisher replay: %w", err)
		}
		p.wg.Add(1)
		go p.serveReplay(ctx)
	}
	return p, nil
}

// Endpoint is the PUB endpoint, with a port-0 request resolved.
func (p *Publisher) Endpoint() string { return p.endpoint }

// ReplayEndpoint is the bound replay endpoint, or "".
func (p *Publisher) ReplayEndpoint() string { return p.replayEP }

// Sink publishes one engine batch and logs failures; it has the shape of
// engine.EventSink, so eng.SetEventSink(pub.Sink) attaches it.
func (p *Publisher) Sink(evs []kv.Event) {
	if err := p.Publish(evs); err != nil {
		p.log.Warn("kv event publish failed", "err", err)
	}
}

// Publish sends kv events, one wire batch per run of events with the same
// DP rank.
func (p *Publisher) Publish(evs []kv.Event) error {
	if len(evs) == 0 {
		return nil
	}
	ts := float64(p.cfg.Now().UnixNano()) / 1e9
	for _, b := range ToWire(evs, p.cfg.BlockSize, ts) {
		if _, err := p.PublishBatch(&b); err != nil {
			return err
		}
	}
	return nil
}

// ErrPublisherClosed is returned after Close.
var ErrPublisherClosed = errors.New("events publisher closed")

// PublishBatch sends one wire batch and returns its sequence number.
func (p *Publisher) PublishBatch(b *Batch) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, ErrPublisherClosed
	}
	payload, err := p.enc.EncodeBatch(b, p.cfg.Shape)
	if err != nil {
		p.encErr.Add(1)
		return 0, fmt.Errorf("events publisher: encode: %w", err)
	}
	p.events.Add(uint64(len(b.Events)))
	return p.publishLocked(payload)
}

// publishLocked assigns the next seq to payload, rings it and sends it.
func (p *Publisher) publishLocked(payload []byte) (uint64, error) {
	seq := p.seq
	p.seq++
	if len(p.ring) < p.cfg.BufferSteps {
		p.ring = append(p.ring, ringEntry{seq, payload})
	} else {
		p.ring[p.head] = ringEntry{seq, payload}
		p.head = (p.head + 1) % len(p.ring)
	}
	live := payload
	if p.liveFrame != nil {
		if live = p.liveFrame(seq, payload); live == nil {
			return seq, nil
		}
	}
	// The PUB socket queues without blocking (dropping above HWM, as ZMQ
	// does); subscribers that miss a batch repair it through replay.
	if err := p.pub.SendMulti(zmq4.NewMsgFrom([]byte(p.cfg.Topic), seqBytes(seq), live)); err != nil {
		return seq, fmt.Errorf("events publisher: send seq %d: %w", seq, err)
	}
	return seq, nil
}

// Stats returns the publisher's counters.
func (p *Publisher) Stats() PublisherStats {
	p.mu.Lock()
	batches := p.seq
	p.mu.Unlock()
	return PublisherStats{Batches: batches, Events: p.events.Load(), EncodeErrors: p.encErr.Load(),
		ReplayRequests: p.replayReq.Load(), ReplayBad: p.replayBad.Load(), ReplayBatches: p.replayed.Load()}
}

// since copies the ring entries with seq ≥ start, oldest first.
func (p *Publisher) since(start uint64) []ringEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []ringEntry
	for i := range p.ring {
		e := p.ring[(p.head+i)%len(p.ring)]
		if e.seq >= start {
			out = append(out, e)
		}
	}
	return out
}

func (p *Publisher) serveReplay(ctx context.Context) {
	defer p.wg.Done()
	for {
		msg, err := p.replay.Recv()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			// A peer that hung up surfaces here; the socket itself is fine.
			continue
		}
		// [identity, "", start] from DEALER/REQ clients; [identity, start]
		// from clients that skip the delimiter.
		f := msg.Frames
		if len(f) == 3 && len(f[1]) == 0 {
			f = [][]byte{f[0], f[2]}
		}
		start, ok := uint64(0), len(f) == 2
		if ok {
			start, ok = seqOf(f[1])
		}
		if !ok {
			p.replayBad.Add(1)
			p.log.Warn("bad kv event replay request", "frames", len(msg.Frames))
			continue
		}
		p.replayReq.Add(1)
		id := f[0]
		for _, e := range p.since(start) {
			if err := p.replay.SendMulti(zmq4.NewMsgFrom(id, nil, seqBytes(e.seq), e.payload)); err != nil {
				p.log.Warn("kv event replay send failed", "err", err)
				break
			}
			p.replayed.Add(1)
		}
		if err := p.replay.SendMulti(zmq4.NewMsgFrom(id, nil, endMarker, nil)); err != nil && ctx.Err() == nil {
			p.log.Warn("kv event replay end marker failed", "err", err)
		}
	}
}

// Close stops the replay server and closes both sockets.
func (p *Publisher) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	err := closeSocket(p.pub)
	if p.replay != nil {
		if e := closeSocket(p.replay); err == nil {
			err = e
		}
	}
	p.wg.Wait()
	return err
}

// closeSocket closes a ZMQ socket. A connection its peer already hung up
// is closed by zmq4's reader too, so closing it again says net.ErrClosed:
// that is a finished connection, not a failure to close.
func closeSocket(s zmq4.Socket) error {
	if err := s.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

// Sink has the shape of engine.EventSink (events may not import engine).
var _ func([]kv.Event) = (*Publisher)(nil).Sink
