package mockengine

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/kvcr"
)

// KVCRConfig turns on a mock engine's KVCR linker inventory: the sim's
// block-manager tiers stand for KVCR's (host = its DRAM, published as CPU;
// disk = its G3, published as STORAGE) and are published as the linker's
// inventory, device blocks staying on the engine's own KV events.
type KVCRConfig struct {
	// Endpoint is where the inventory PUB binds; ReplayEndpoint, when
	// set, a replay ROUTER.
	Endpoint, ReplayEndpoint string
	// Owner is the cache-owner id reported; it should outlive the process
	// (give the same one to a restarted engine).
	Owner string
	// HashDomain is the engine's (kvcr.HashDomainSGLang for SGLang: hashes
	// go out signed).
	HashDomain string
	// Scope and HintForwarding default to the supported values
	// (process_local, on); tests set others to see validation refuse them.
	Scope          string
	HintForwarding *bool
}

// KVCRInventory publishes a mock engine's KVCR-tier blocks as a linker's
// inventory and describes it as SGLang's scheduler does.
type KVCRInventory struct {
	pub  *kvcr.Publisher
	desc kvcr.Descriptor
	log  *slog.Logger

	// The block manager's events name blocks by hash only, but the wire
	// carries each block's tokens (the receiver rehashes them): the
	// tokens, LoRA and salt of every block some tier holds, from the
	// device stores that first announced them.
	mu     sync.Mutex
	blocks map[kv.EngineHash]*heldBlock
	// Untokened counts inventory blocks cut because no tier announced
	// their tokens first.
	untokened atomic.Uint64
}

type heldBlock struct {
	tiers      uint8 // bit per tier holding it
	tokens     []kv.Token
	lora, salt string
}

// NewKVCRInventory binds the publisher and announces a new epoch (an
// AllBlocksCleared first, as a linker does before re-announcing).
func NewKVCRInventory(ctx context.Context, cfg KVCRConfig, blockSize int, log *slog.Logger) (*KVCRInventory, error) {
	if cfg.Owner == "" {
		return nil, fmt.Errorf("kvcr inventory: no cache owner id")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := kvcr.Descriptor{CacheOwner: cfg.Owner, Topic: kvcr.TopicFor(cfg.Owner), BlockSize: blockSize, HashDomain: cfg.HashDomain,
		Scope: cfg.Scope, Media: kvcr.InventoryMedia(), HintForwarding: cfg.HintForwarding == nil || *cfg.HintForwarding}
	if d.Scope == "" {
		d.Scope = kvcr.ScopeProcessLocal
	}
	pub, err := kvcr.NewPublisher(ctx, kvcr.PublisherConfig{Endpoint: cfg.Endpoint, ReplayEndpoint: cfg.ReplayEndpoint, Descriptor: d, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("kvcr inventory: %w", err)
	}
	if err := pub.Clear(); err != nil {
		pub.Close()
		return nil, fmt.Errorf("kvcr inventory: %w", err)
	}
	return &KVCRInventory{pub: pub, desc: d, log: log, blocks: map[kv.EngineHash]*heldBlock{}}, nil
}

// Descriptor is what the engine reports as "kvcr_inventory".
func (k *KVCRInventory) Descriptor() kvcr.Descriptor { return k.desc }

// Endpoint and ReplayEndpoint are the bound endpoints.
func (k *KVCRInventory) Endpoint() string       { return k.pub.Endpoint() }
func (k *KVCRInventory) ReplayEndpoint() string { return k.pub.ReplayEndpoint() }

// Split returns a sink that publishes the host and disk tiers' events as
// inventory (in the engine's hash domain) and hands the rest (device
// events, clears) to next, which may be nil.
func (k *KVCRInventory) Split(next engine.EventSink) engine.EventSink {
	return func(evs []kv.Event) {
		var dev, inv []kv.Event
		k.mu.Lock()
		for _, e := range evs {
			k.track(e)
			if e.Kind != kv.EventCleared && (e.Tier == kv.TierHost || e.Tier == kv.TierDisk) {
				if e.Kind == kv.EventStored {
					if e = k.tokened(e); len(e.Blocks) == 0 {
						continue
					}
				}
				inv = append(inv, e)
			} else {
				dev = append(dev, e)
			}
		}
		k.mu.Unlock()
		if len(inv) > 0 {
			if err := k.pub.Publish(ToEngineDomain(inv)); err != nil {
				k.log.Warn("kvcr inventory publish failed", "err", err)
			}
		}
		if len(dev) > 0 && next != nil {
			next(dev)
		}
	}
}

// track keeps the tokens of every block some tier holds.
func (k *KVCRInventory) track(e kv.Event) {
	switch e.Kind {
	case kv.EventCleared:
		clear(k.blocks)
	case kv.EventStored:
		bs := k.desc.BlockSize
		full := len(e.Tokens) == len(e.Blocks)*bs
		for i, b := range e.Blocks {
			h := k.blocks[b.EngineHash]
			if h == nil {
				h = &heldBlock{}
				k.blocks[b.EngineHash] = h
			}
			h.tiers |= 1 << e.Tier
			if full && h.tokens == nil {
				h.tokens, h.lora, h.salt = e.Tokens[i*bs:(i+1)*bs], e.LoRA, e.Salt
			}
		}
	case kv.EventRemoved:
		for _, r := range e.Removed {
			if h := k.blocks[r]; h != nil {
				if h.tiers &^= 1 << e.Tier; h.tiers == 0 {
					delete(k.blocks, r)
				}
			}
		}
	}
}

// tokened gives a tier store its blocks' tokens, cut at the first block
// whose tokens are unknown.
func (k *KVCRInventory) tokened(e kv.Event) kv.Event {
	toks := make([]kv.Token, 0, len(e.Blocks)*k.desc.BlockSize)
	for i, b := range e.Blocks {
		h := k.blocks[b.EngineHash]
		if h == nil || h.tokens == nil {
			k.untokened.Add(uint64(len(e.Blocks) - i))
			e.Blocks = e.Blocks[:i]
			break
		}
		if i == 0 {
			e.LoRA, e.Salt = h.lora, h.salt
		}
		toks = append(toks, h.tokens...)
	}
	e.Tokens = toks
	return e
}

// Close closes the publisher.
func (k *KVCRInventory) Close() error { return k.pub.Close() }
