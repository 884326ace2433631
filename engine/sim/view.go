package sim

import (
	"fmt"

	"github.com/kvmesh/kvmesh/kv"
)

// Zero-copy access for peers serving the cache (transfer.BlockViewer and
// transfer.BlockChecksummer): a block's layers are contiguous in the slab,
// so its whole payload is one slice.
//
// Why a pinned view is safe to read without the engine's lock: payload
// bytes are written only once per allocation of a block — a fetched block's
// by Insert right after pool.alloc, a computed block's by pool.fill on the
// first read of its bytes or checksum (ViewBlock, ReadPayload,
// BlockChecksum), under the lock — and alloc takes only blocks with no
// reference (the free stack or the idle LRU list). A pin is a reference,
// so while it is held the block is neither evicted nor reused, its hash
// keeps mapping to it, and its bytes do not change once ViewBlock has
// returned them; the lock ViewBlock takes orders the writes before any
// read through the view.

// blockPayload is block id's payload, every layer concatenated.
func (p *pool) blockPayload(id int32) []byte {
	n := p.layers * p.psize
	off := int(id) * n
	return p.slab[off : off+n : off+n]
}

// storeSum records the checksum of block id's payload as it is stored
// (Config.StoreChecksums).
func (p *pool) storeSum(id int32) {
	if p.sums == nil {
		return
	}
	p.sums[id] = kv.Checksum(p.blockPayload(id))
}

// ViewBlock returns the payload of the cached block seq, every layer
// concatenated, aliasing the pool's memory: no copy. The caller must hold
// a Pin on seq; the slice is valid and unchanged until that pin is
// released, and must not be modified. A block that is not cached, or is
// cached but referenced by nothing (so not pinned), is an error.
func (c *Core) ViewBlock(seq kv.SeqHash) ([]byte, error) {
	if v, _, ok := c.hostView(seq); ok {
		return v, nil // pinned in the host tier: a pin held past the device prefix
	}
	id, ok := c.pool.byHash.Get(seq)
	if !ok {
		return nil, fmt.Errorf("sim: block %016x is not cached", seq)
	}
	if c.pool.blocks[id].ref <= 0 {
		return nil, fmt.Errorf("sim: block %016x is not pinned; pin it before viewing its payload", seq)
	}
	c.pool.fill(id)
	return c.pool.blockPayload(id), nil
}

// BlockChecksum returns kv.Checksum of the cached block seq's payload (all
// layers concatenated), computed when the block was stored or inserted, so
// bytes that changed since then no longer match it. ok is false when the
// block is not cached or Config.StoreChecksums is off.
func (c *Core) BlockChecksum(seq kv.SeqHash) (sum uint64, ok bool) {
	if _, sum, ok := c.hostView(seq); ok {
		return sum, true
	}
	id, ok := c.pool.byHash.Get(seq)
	if !ok || c.pool.sums == nil {
		return 0, false
	}
	c.pool.fill(id)
	return c.pool.sums[id], true
}

// BlockDomain returns the salt domain (kv.Seed of the LoRA and cache salt)
// the cached block seq was computed or inserted under.
func (c *Core) BlockDomain(seq kv.SeqHash) (uint64, bool) {
	id, ok := c.pool.byHash.Get(seq)
	if !ok {
		if c.kb != nil {
			return c.kb.domains.Get(seq) // a block the tiers hold
		}
		return 0, false
	}
	return c.pool.domains[id], true
}

// BlockDomain is Core.BlockDomain under the engine's lock.
func (e *Engine) BlockDomain(seq kv.SeqHash) (uint64, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.core.BlockDomain(seq)
}

// ViewBlock is Core.ViewBlock under the engine's lock. The returned slice
// may be read after the call without the lock for as long as the caller's
// Pin on seq is held (see the note on pinned views above).
func (e *Engine) ViewBlock(seq kv.SeqHash) ([]byte, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.core.ViewBlock(seq)
}

// BlockChecksum is Core.BlockChecksum under the engine's lock.
func (e *Engine) BlockChecksum(seq kv.SeqHash) (uint64, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.core.BlockChecksum(seq)
}
