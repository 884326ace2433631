package kvcr

import (
	"context"
	"log/slog"
	"time"

	"github.com/kvmesh/kvmesh/events"
	"github.com/kvmesh/kvmesh/kv"
)

// Media a linker's inventory uses: KVCR's local DRAM is published as CPU
// and its file-backed G3 as STORAGE (the names vLLM's KVCR adapter and
// Dynamo's router use); the framework's device blocks as GPU.
var inventoryMedium = [kv.NumTiers]string{"GPU", "CPU", "STORAGE", "EXTERNAL"}

// InventoryMedia lists the media Publisher writes.
func InventoryMedia() []string { return []string{"GPU", "CPU", "STORAGE"} }

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Endpoint is where the PUB binds (tcp://127.0.0.1:0 picks a port);
	// ReplayEndpoint, when set, binds a replay socket.
	Endpoint, ReplayEndpoint string
	// Descriptor gives the topic, block size and hash domain; an SGLang
	// domain writes hashes as signed int64.
	Descriptor Descriptor
	Logger     *slog.Logger
}

// Publisher publishes kv events as a KVCR linker's inventory: on the
// owner's topic, SGLang's map-shaped events, KVCR's media. It stands in
// for the linker in tests and in the mock engines.
type Publisher struct {
	pub *events.Publisher
	bs  int
}

// NewPublisher binds the publisher.
func NewPublisher(ctx context.Context, cfg PublisherConfig) (*Publisher, error) {
	d := cfg.Descriptor
	p, err := events.NewPublisher(ctx, events.PublisherConfig{Endpoint: cfg.Endpoint, BindMode: events.Bind, ReplayEndpoint: cfg.ReplayEndpoint,
		Topic: d.Topic, Shape: events.ShapeMapEvents, BlockSize: d.BlockSize, SignedHashes: d.HashDomain == HashDomainSGLang, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	return &Publisher{pub: p, bs: d.BlockSize}, nil
}

// Endpoint and ReplayEndpoint are the bound endpoints.
func (p *Publisher) Endpoint() string       { return p.pub.Endpoint() }
func (p *Publisher) ReplayEndpoint() string { return p.pub.ReplayEndpoint() }

// Publish sends evs (engine hashes already in the descriptor's domain)
// with KVCR's media.
func (p *Publisher) Publish(evs []kv.Event) error {
	if len(evs) == 0 {
		return nil
	}
	ts := float64(time.Now().UnixNano()) / 1e9
	for _, b := range events.ToWire(evs, p.bs, ts) {
		for i := range b.Events {
			if b.Events[i].HasMedium {
				if t, ok := kv.TierFromMedium(b.Events[i].Medium); ok {
					b.Events[i].Medium = inventoryMedium[t]
				}
			}
		}
		if _, err := p.pub.PublishBatch(&b); err != nil {
			return err
		}
	}
	return nil
}

// Clear publishes AllBlocksCleared: a linker's first batch of an epoch,
// before it re-announces what survived.
func (p *Publisher) Clear() error {
	_, err := p.pub.PublishBatch(&events.Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: []events.Event{{Type: events.TypeCleared}}})
	return err
}

// Stats are the underlying publisher's.
func (p *Publisher) Stats() events.PublisherStats { return p.pub.Stats() }

// Close closes the sockets.
func (p *Publisher) Close() error { return p.pub.Close() }
