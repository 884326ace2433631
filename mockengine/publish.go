package mockengine

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/kvmesh/kvmesh/events"
	"github.com/kvmesh/kvmesh/internal/mix"
	"github.com/kvmesh/kvmesh/kv"
)

// EngineHash is the block hash a mock engine reports for the block with
// kvmesh sequence hash seq: a bijective mix (splitmix64's finaliser) of it.
// A real engine hashes in its own domain (vLLM: the last 8 bytes of a
// SHA-256), so the mocks do not publish kvmesh's hashes either: a consumer
// that mixes the two domains up fails against them as it would against
// the real engine. The mix is a bijection, so distinct blocks keep
// distinct hashes.
func EngineHash(seq kv.SeqHash) kv.EngineHash { return kv.EngineHash(mix.Mix64(uint64(seq))) }

// EventsConfig says where a mock engine publishes KV events. Rank r of a
// data-parallel engine uses events.RankEndpoint(endpoint, r) for both
// sockets, as vLLM does.
type EventsConfig struct {
	Endpoint       string // PUB endpoint
	ReplayEndpoint string // ROUTER endpoint; "" disables replay
	BindMode       events.BindMode
	Topic          string
	Shape          events.Shape
	BufferSteps    int
	HWM            int
}

// RankPublishers is one vLLM-wire publisher per DP rank behind one event
// sink: events are mapped to the engine's hash domain (EngineHash) and sent
// on their rank's publisher.
type RankPublishers struct {
	pubs      []*events.Publisher
	blockSize int
	log       *slog.Logger
}

// NewRankPublishers opens ranks publishers. blockSize is written as each
// store's block_size.
func NewRankPublishers(ctx context.Context, cfg EventsConfig, ranks, blockSize int, log *slog.Logger) (*RankPublishers, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	rp := &RankPublishers{blockSize: blockSize, log: log}
	for r := range ranks {
		ep, err := events.RankEndpoint(cfg.Endpoint, r)
		if err != nil {
			rp.Close()
			return nil, fmt.Errorf("kv events rank %d: %w", r, err)
		}
		var rep string
		if cfg.ReplayEndpoint != "" {
			if rep, err = events.RankEndpoint(cfg.ReplayEndpoint, r); err != nil {
				rp.Close()
				return nil, fmt.Errorf("kv events replay rank %d: %w", r, err)
			}
		}
		p, err := events.NewPublisher(ctx, events.PublisherConfig{Endpoint: ep, BindMode: cfg.BindMode,
			ReplayEndpoint: rep, Topic: cfg.Topic, Shape: cfg.Shape, BufferSteps: cfg.BufferSteps,
			HWM: cfg.HWM, BlockSize: blockSize, Logger: log})
		if err != nil {
			rp.Close()
			return nil, fmt.Errorf("kv events rank %d: %w", r, err)
		}
		rp.pubs = append(rp.pubs, p)
	}
	return rp, nil
}

// Publisher is rank r's publisher.
func (rp *RankPublishers) Publisher(r int) *events.Publisher { return rp.pubs[r] }

// ToEngineDomain returns evs with every block hash mapped to the mock
// engine's domain (EngineHash); local hashes and the rest are kept.
func ToEngineDomain(evs []kv.Event) []kv.Event {
	out := make([]kv.Event, len(evs))
	for i, e := range evs {
		out[i] = e
		switch e.Kind {
		case kv.EventStored:
			if e.HasParent {
				out[i].Parent = EngineHash(kv.SeqHash(e.Parent))
			}
			bl := make([]kv.StoredBlock, len(e.Blocks))
			for j, b := range e.Blocks {
				bl[j] = kv.StoredBlock{EngineHash: EngineHash(kv.SeqHash(b.EngineHash)), LocalHash: b.LocalHash}
			}
			out[i].Blocks = bl
		case kv.EventRemoved:
			rm := make([]kv.EngineHash, len(e.Removed))
			for j, h := range e.Removed {
				rm[j] = EngineHash(kv.SeqHash(h))
			}
			out[i].Removed = rm
		}
	}
	return out
}

// Sink has the shape of engine.EventSink: it maps evs to engine hashes and
// publishes them on their ranks' publishers.
func (rp *RankPublishers) Sink(evs []kv.Event) {
	out := ToEngineDomain(evs)
	// One publish per run of a rank (events.ToWire splits by rank too, but
	// each rank has its own socket and sequence).
	for start := 0; start < len(out); {
		r := int(out[start].Worker.DPRank)
		end := start + 1
		for end < len(out) && int(out[end].Worker.DPRank) == r {
			end++
		}
		if r < len(rp.pubs) {
			if err := rp.pubs[r].Publish(out[start:end]); err != nil {
				rp.log.Warn("kv event publish failed", "rank", r, "err", err)
			}
		}
		start = end
	}
}

// Close closes every publisher.
func (rp *RankPublishers) Close() error {
	var first error
	for _, p := range rp.pubs {
		if err := p.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
