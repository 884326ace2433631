package hints

import (
	"fmt"

	"github.com/kvmesh/kvmesh/kv"
)

// FromHint lowers a typed hint to the envelope an engine that reads JSON
// receives: message_id is the hint's selection id, one kv.fetch action
// naming the source's endpoint and its engine hashes.
func FromHint(h *kv.Hint) *Envelope {
	hashes := make([]uint64, len(h.Hashes))
	for i, e := range h.Hashes {
		hashes[i] = uint64(e)
	}
	return NewFetch(h.ID, h.Endpoint, hashes)
}

// Hint is the envelope's first kv.fetch as a typed hint (no source key:
// the envelope names none), or false when it has none or it names no
// source endpoint (a fetch from local storage, which kvmesh does not plan).
func (e *Envelope) Hint() (*kv.Hint, bool) {
	f, ok := e.Fetch()
	if !ok || f.SourceEndpoint == "" {
		return nil, false
	}
	h := &kv.Hint{ID: e.MessageID, Endpoint: f.SourceEndpoint, Hashes: make([]kv.EngineHash, len(f.BlockHashes))}
	for i, b := range f.BlockHashes {
		h.Hashes[i] = kv.EngineHash(b)
	}
	return h, true
}

// CheckHint validates a typed hint where it enters a worker, with the
// envelope's rules: a canonical tcp://host:port source endpoint (h.Endpoint
// is rewritten to its canonical spelling), at least one block hash, and no
// more than maxBlocks (the prompt's full blocks: a root-aligned prefix is
// never longer), none past kv.MaxHintBlocks, and an id within
// kv.MaxHintIDLen without control characters. Errors are *Error (ErrMalformed) naming the field.
func CheckHint(h *kv.Hint, maxBlocks int) error {
	ep, err := kv.ParseEndpoint(h.Endpoint)
	if err != nil {
		return &Error{"kv_fetch.source_control_endpoint", err.Error()}
	}
	if err := checkName("message_id", h.ID); err != nil {
		return err
	}
	switch n := len(h.Hashes); {
	case n == 0:
		return &Error{"kv_fetch.block_hashes", "must not be empty"}
	case n > kv.MaxHintBlocks:
		return &Error{"kv_fetch.block_hashes", fmt.Sprintf("%d hashes, a fetch takes at most %d", n, kv.MaxHintBlocks)}
	case n > maxBlocks:
		return &Error{"kv_fetch.block_hashes", fmt.Sprintf("%d hashes for a prompt of %d full blocks", n, maxBlocks)}
	}
	h.Endpoint = ep.String()
	return nil
}
