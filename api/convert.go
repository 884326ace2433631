package api

import (
	"errors"
	"fmt"

	"github.com/kvmesh/kvmesh/kv"
)

// KeyToProto converts a worker key.
func KeyToProto(w kv.WorkerKey) *WorkerKey {
	return &WorkerKey{Instance: w.Instance, DpRank: w.DPRank}
}

// KeyFromProto converts a worker key; nil is the zero key.
func KeyFromProto(w *WorkerKey) kv.WorkerKey {
	return kv.WorkerKey{Instance: w.GetInstance(), DPRank: w.GetDpRank()}
}

// EventToProto converts a KV event. Slices are shared, not copied.
func EventToProto(e *kv.Event) *KvEvent {
	p := &KvEvent{
		Id:        e.ID,
		Worker:    KeyToProto(e.Worker),
		Tier:      uint32(e.Tier),
		HasParent: e.HasParent,
		Parent:    uint64(e.Parent),
		Tokens:    e.Tokens,
		Lora:      e.LoRA,
		Salt:      e.Salt,
		Removed:   kv.RawHashes(e.Removed),
	}
	switch e.Kind {
	case kv.EventStored:
		p.Kind = EventKind_EVENT_KIND_STORED
	case kv.EventRemoved:
		p.Kind = EventKind_EVENT_KIND_REMOVED
	case kv.EventCleared:
		p.Kind = EventKind_EVENT_KIND_CLEARED
	}
	if len(e.Blocks) > 0 {
		bs := make([]StoredBlock, len(e.Blocks))
		p.Blocks = make([]*StoredBlock, len(e.Blocks))
		for i, b := range e.Blocks {
			bs[i].EngineHash, bs[i].LocalHash = uint64(b.EngineHash), uint64(b.LocalHash)
			p.Blocks[i] = &bs[i]
		}
	}
	return p
}

// EventFromProto converts and validates a KV event from the wire.
func EventFromProto(p *KvEvent) (kv.Event, error) {
	if p == nil {
		return kv.Event{}, fmt.Errorf("kv event: nil")
	}
	e := kv.Event{
		ID:        p.Id,
		Worker:    KeyFromProto(p.Worker),
		HasParent: p.HasParent,
		Parent:    kv.EngineHash(p.Parent),
		Tokens:    p.Tokens,
		LoRA:      p.Lora,
		Salt:      p.Salt,
		Removed:   kv.AsHashes[kv.EngineHash](p.Removed),
	}
	if p.Tier >= kv.NumTiers {
		return kv.Event{}, fmt.Errorf("kv event %d: unknown tier %d", p.Id, p.Tier)
	}
	e.Tier = kv.Tier(p.Tier)
	switch p.Kind {
	case EventKind_EVENT_KIND_STORED:
		e.Kind = kv.EventStored
		if len(p.Blocks) == 0 {
			return kv.Event{}, fmt.Errorf("kv event %d: stored event without blocks", p.Id)
		}
		e.Blocks = make([]kv.StoredBlock, len(p.Blocks))
		for i, b := range p.Blocks {
			e.Blocks[i] = kv.StoredBlock{EngineHash: kv.EngineHash(b.GetEngineHash()), LocalHash: kv.LocalHash(b.GetLocalHash())}
		}
	case EventKind_EVENT_KIND_REMOVED:
		e.Kind = kv.EventRemoved
	case EventKind_EVENT_KIND_CLEARED:
		e.Kind = kv.EventCleared
	default:
		return kv.Event{}, fmt.Errorf("kv event %d: unknown kind %v", p.Id, p.Kind)
	}
	return e, nil
}

// EventsToProto converts a batch.
func EventsToProto(evs []kv.Event) []*KvEvent {
	out := make([]*KvEvent, len(evs))
	for i := range evs {
		out[i] = EventToProto(&evs[i])
	}
	return out
}

// EventsFromProto converts a batch; the first bad event fails it.
func EventsFromProto(ps []*KvEvent) ([]kv.Event, error) {
	out := make([]kv.Event, len(ps))
	for i, p := range ps {
		e, err := EventFromProto(p)
		if err != nil {
			return nil, err
		}
		out[i] = e
	}
	return out, nil
}

// LegToProto converts a disaggregation leg.
func LegToProto(l kv.Leg) Leg {
	switch l {
	case kv.LegPrefill:
		return Leg_LEG_PREFILL
	case kv.LegDecode:
		return Leg_LEG_DECODE
	}
	return Leg_LEG_WHOLE
}

// LegFromProto converts a disaggregation leg from the wire; an unknown
// value is an error (a newer peer's leg this worker cannot serve).
func LegFromProto(l Leg) (kv.Leg, error) {
	switch l {
	case Leg_LEG_WHOLE:
		return kv.LegWhole, nil
	case Leg_LEG_PREFILL:
		return kv.LegPrefill, nil
	case Leg_LEG_DECODE:
		return kv.LegDecode, nil
	}
	return 0, fmt.Errorf("unknown leg %d", l)
}

// HintToProto converts a KV hint; nil stays nil.
func HintToProto(h *kv.Hint) *KvFetchHint {
	if h == nil {
		return nil
	}
	p := &KvFetchHint{MessageId: h.ID, Source: KeyToProto(h.Source), SourceControlEndpoint: h.Endpoint,
		BlockHashes: make([]uint64, len(h.Hashes))}
	for i, e := range h.Hashes {
		p.BlockHashes[i] = uint64(e)
	}
	return p
}

// HintFromProto converts a KV hint from the wire, unvalidated: the worker
// validates it where it enters (hints.CheckHint). nil stays nil.
func HintFromProto(p *KvFetchHint) *kv.Hint {
	if p == nil {
		return nil
	}
	h := &kv.Hint{ID: p.MessageId, Source: KeyFromProto(p.Source), Endpoint: p.SourceControlEndpoint,
		Hashes: make([]kv.EngineHash, len(p.BlockHashes))}
	for i, e := range p.BlockHashes {
		h.Hashes[i] = kv.EngineHash(e)
	}
	return h
}

// SamplingToProto sets req's sampling fields from s. A TopP of 0 (not set)
// stays absent on the wire, so the engine's default applies.
func SamplingToProto(req *GenerateRequest, s *kv.Sampling) {
	req.MaxTokens = uint32(s.MaxTokens)
	req.MinTokens = uint32(s.MinTokens)
	req.IgnoreEos = s.IgnoreEOS
	req.StopTokenIds = s.StopTokens
	req.Seed = s.Seed
	req.Temperature = s.Temperature
	req.TopP = nil
	if s.TopP != 0 {
		tp := s.TopP
		req.TopP = &tp
	}
	req.PresencePenalty = s.PresencePenalty
	req.FrequencyPenalty = s.FrequencyPenalty
}

// SamplingFromProto reads req's sampling fields and checks their ranges;
// the error names the field as the wire does. StopTokens shares req's slice.
func SamplingFromProto(req *GenerateRequest) (kv.Sampling, error) {
	s := kv.Sampling{
		MaxTokens: int(req.MaxTokens), MinTokens: int(req.MinTokens), IgnoreEOS: req.IgnoreEos,
		StopTokens: req.StopTokenIds, Seed: req.Seed,
		Temperature: req.Temperature, TopP: req.GetTopP(),
		PresencePenalty: req.PresencePenalty, FrequencyPenalty: req.FrequencyPenalty,
	}
	switch {
	case req.MaxTokens == 0:
		return s, errors.New("max_tokens must be ≥ 1")
	case req.MinTokens > req.MaxTokens:
		return s, fmt.Errorf("min_tokens %d exceeds max_tokens %d", req.MinTokens, req.MaxTokens)
	case !(req.Temperature >= 0): // also NaN
		return s, fmt.Errorf("temperature %g, want ≥ 0", req.Temperature)
	case req.TopP != nil && !(*req.TopP > 0 && *req.TopP <= 1):
		return s, fmt.Errorf("top_p %g, want in (0, 1]", *req.TopP)
	case !(req.PresencePenalty >= -2 && req.PresencePenalty <= 2):
		return s, fmt.Errorf("presence_penalty %g, want in [-2, 2]", req.PresencePenalty)
	case !(req.FrequencyPenalty >= -2 && req.FrequencyPenalty <= 2):
		return s, fmt.Errorf("frequency_penalty %g, want in [-2, 2]", req.FrequencyPenalty)
	}
	return s, nil
}

// UsageToProto converts a generation's token accounting; cached is its
// cached prompt tokens by source (their sum is the total sent).
func UsageToProto(prompt, completion int, cached kv.CachedByTier) *Usage {
	u32 := func(n int) uint32 { return uint32(max(n, 0)) }
	return &Usage{
		PromptTokens: u32(prompt), CompletionTokens: u32(completion), CachedTokens: u32(cached.Total()),
		HostCachedTokens: u32(cached[kv.TierHost]), DiskCachedTokens: u32(cached[kv.TierDisk]),
		ExternalCachedTokens: u32(cached[kv.TierExternal]), PeerCachedTokens: u32(cached[kv.PeerCached]),
	}
}

// CachedFromProto splits u's cached tokens by source: the device share is
// what the others leave of the total, so a usage without a split (an older
// worker) counts all of it as device, and a split larger than the total is
// cut down to it.
func CachedFromProto(u *Usage) kv.CachedByTier {
	var c kv.CachedByTier
	left := int(u.GetCachedTokens())
	for _, s := range [...]struct {
		i int
		n uint32
	}{{kv.PeerCached, u.GetPeerCachedTokens()}, {int(kv.TierHost), u.GetHostCachedTokens()},
		{int(kv.TierDisk), u.GetDiskCachedTokens()}, {int(kv.TierExternal), u.GetExternalCachedTokens()}} {
		c[s.i] = min(int(s.n), left)
		left -= c[s.i]
	}
	c[kv.TierDevice] = left
	return c
}
