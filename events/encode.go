package events

import (
	"bytes"
	"fmt"

	"github.com/kvmesh/kvmesh/kv"
	"github.com/vmihailenco/msgpack/v5"
)

// Encoder writes batches in vLLM's msgpack layout. Integers take their
// smallest msgpack form, ts is always a float64, strings use fixstr/str8/…
// as msgspec does. An Encoder is not safe for concurrent use.
type Encoder struct {
	buf bytes.Buffer
	enc *msgpack.Encoder
	// SignedHashes writes block hashes as signed int64 (SGLang's form: the
	// first 8 bytes of a SHA-256 read as a signed integer); the bits are the
	// same, only the msgpack type differs.
	SignedHashes bool
}

// NewEncoder returns an Encoder.
func NewEncoder() *Encoder {
	e := &Encoder{}
	e.enc = msgpack.NewEncoder(&e.buf)
	return e
}

// EncodeBatch returns b encoded in shape s. The returned slice is a fresh
// copy the caller may keep.
func (e *Encoder) EncodeBatch(b *Batch, s Shape) ([]byte, error) {
	e.buf.Reset()
	if err := e.batch(b, s); err != nil {
		return nil, err
	}
	return bytes.Clone(e.buf.Bytes()), nil
}

// EncodeBatch is a convenience for one-off encodes.
func EncodeBatch(b *Batch, s Shape) ([]byte, error) { return NewEncoder().EncodeBatch(b, s) }

func (e *Encoder) batch(b *Batch, s Shape) error {
	w := e.enc
	if s == ShapeSGLang {
		return e.sglangBatch(b)
	}
	mapEvents := s == ShapeMapEvents || s == ShapeMap
	if s == ShapeMap {
		must(w.EncodeMapLen(3))
		must(w.EncodeString(keyTS))
	} else {
		must(w.EncodeArrayLen(3))
	}
	must(w.EncodeFloat64(b.TS))
	if s == ShapeMap {
		must(w.EncodeString(keyEvents))
	}
	must(w.EncodeArrayLen(len(b.Events)))
	for i := range b.Events {
		if err := e.event(&b.Events[i], mapEvents); err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
	}
	if s == ShapeMap {
		must(w.EncodeString(keyDPRank))
	}
	if b.HasDPRank {
		must(w.EncodeInt(b.DPRank))
	} else {
		must(w.EncodeNil())
	}
	return nil
}

// must documents that writes into a bytes.Buffer cannot fail.
func must(err error) {
	if err != nil {
		panic(fmt.Sprintf("events: msgpack write to memory failed: %v", err))
	}
}

func (e *Encoder) event(ev *Event, asMap bool) error {
	w := e.enc
	key := func(k string) {
		if asMap {
			must(w.EncodeString(k))
		}
	}
	// head opens the event: a map of n entries or an array of n fields.
	head := func(n int) {
		if asMap {
			must(w.EncodeMapLen(n))
		} else {
			must(w.EncodeArrayLen(n))
		}
	}
	switch ev.Type {
	case TypeStored:
		head(9)
		key(keyType)
		must(w.EncodeString(TagStored))
		key(keyHashes)
		e.hashes(ev.BlockHashes)
		key(keyParent)
		if ev.HasParent {
			must(w.EncodeUint(uint64(ev.Parent)))
		} else {
			must(w.EncodeNil())
		}
		key(keyTokens)
		must(w.EncodeArrayLen(len(ev.TokenIDs)))
		for _, t := range ev.TokenIDs {
			must(w.EncodeUint(uint64(t)))
		}
		key(keyBlockSize)
		must(w.EncodeInt(int64(ev.BlockSize)))
		key(keyLoRAID)
		if ev.HasLoRAID {
			must(w.EncodeInt(ev.LoRAID))
		} else {
			must(w.EncodeNil())
		}
		key(keyMedium)
		e.optString(ev.Medium, ev.HasMedium)
		key(keyLoRAName)
		e.optString(ev.LoRAName, ev.HasLoRAName)
		key(keyExtraKeys)
		e.extraKeys(ev)
	case TypeRemoved:
		head(3)
		key(keyType)
		must(w.EncodeString(TagRemoved))
		key(keyHashes)
		e.hashes(ev.BlockHashes)
		key(keyMedium)
		e.optString(ev.Medium, ev.HasMedium)
	case TypeCleared:
		head(1)
		key(keyType)
		must(w.EncodeString(TagCleared))
	default:
		return fmt.Errorf("cannot encode event type %v", ev.Type)
	}
	return nil
}

// sglangBatch writes b as SGLang's publisher does: [ts, events], events
// positional with SGLang's fields (medium and lora_name appended when
// set, as newer builds do), hashes signed.
func (e *Encoder) sglangBatch(b *Batch) error {
	w := e.enc
	must(w.EncodeArrayLen(2))
	must(w.EncodeFloat64(b.TS))
	must(w.EncodeArrayLen(len(b.Events)))
	for i := range b.Events {
		ev := &b.Events[i]
		switch ev.Type {
		case TypeStored:
			// Newer SGLang builds append medium and lora_name (as vLLM
			// does); they are written only when set, so an event without
			// them has the older builds' six fields.
			n := 6
			if ev.HasMedium || ev.HasLoRAName {
				n = 8
			}
			must(w.EncodeArrayLen(n))
			must(w.EncodeString(TagStored))
			e.signedHashes(ev.BlockHashes)
			if ev.HasParent {
				must(w.EncodeInt(int64(ev.Parent)))
			} else {
				must(w.EncodeNil())
			}
			must(w.EncodeArrayLen(len(ev.TokenIDs)))
			for _, t := range ev.TokenIDs {
				must(w.EncodeUint(uint64(t)))
			}
			must(w.EncodeInt(int64(ev.BlockSize)))
			if ev.HasLoRAID {
				must(w.EncodeInt(ev.LoRAID))
			} else {
				must(w.EncodeNil())
			}
			if n == 8 {
				e.optString(ev.Medium, ev.HasMedium)
				e.optString(ev.LoRAName, ev.HasLoRAName)
			}
		case TypeRemoved:
			if ev.HasMedium {
				must(w.EncodeArrayLen(3))
			} else {
				must(w.EncodeArrayLen(2))
			}
			must(w.EncodeString(TagRemoved))
			e.signedHashes(ev.BlockHashes)
			if ev.HasMedium {
				e.optString(ev.Medium, true)
			}
		case TypeCleared:
			must(w.EncodeArrayLen(1))
			must(w.EncodeString(TagCleared))
		default:
			return fmt.Errorf("event %d: cannot encode event type %v", i, ev.Type)
		}
	}
	return nil
}

// signedHashes writes hashes as int64s (the smallest msgpack form, a
// negative one as a signed code), as Python writes SGLang's.
func (e *Encoder) signedHashes(h []kv.EngineHash) {
	must(e.enc.EncodeArrayLen(len(h)))
	for _, v := range h {
		must(e.enc.EncodeInt(int64(v)))
	}
}

func (e *Encoder) hashes(h []kv.EngineHash) {
	must(e.enc.EncodeArrayLen(len(h)))
	for _, v := range h {
		if e.SignedHashes {
			must(e.enc.EncodeInt(int64(v)))
		} else {
			must(e.enc.EncodeUint(uint64(v)))
		}
	}
}

func (e *Encoder) optString(s string, ok bool) {
	if ok {
		must(e.enc.EncodeString(s))
	} else {
		must(e.enc.EncodeNil())
	}
}

// extraKeys writes extra_keys as vLLM does for a salted request: one entry
// per block, the LoRA name on each and the salt after it on the request's
// first block only (a store without a parent). Unsalted stores, and stores
// that continue a chain, write nil as before: receivers take the LoRA name
// from lora_name, and a continuation inherits its parent's salt.
func (e *Encoder) extraKeys(ev *Event) {
	w := e.enc
	if ev.CacheSalt == "" || ev.HasParent || len(ev.BlockHashes) == 0 {
		must(w.EncodeNil())
		return
	}
	must(w.EncodeArrayLen(len(ev.BlockHashes)))
	for i := range ev.BlockHashes {
		n := 0
		if ev.LoRAName != "" {
			n++
		}
		if i == 0 {
			n++
		}
		if n == 0 {
			must(w.EncodeNil())
			continue
		}
		must(w.EncodeArrayLen(n))
		if ev.LoRAName != "" {
			must(w.EncodeString(ev.LoRAName))
		}
		if i == 0 {
			must(w.EncodeString(ev.CacheSalt))
		}
	}
}
