package simpeer

import (
	"slices"

	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/transfer"
)

// SimSource serves a simulated engine's cache to peers. Pins hold blocks
// against eviction and reuse while they are sent. Payloads go out without a
// copy: a block's layers are contiguous in the sim's slab, and a pinned
// block's bytes do not change until its pin is released (see
// sim.Engine.ViewBlock), so the server writes them to the socket straight
// from the slab. When the engine keeps stored checksums
// (sim.Config.StoreChecksums, which New sets for a serving peer) the
// server sends those instead of hashing every payload, and a block that
// changed in the source's memory fails the target's check.
type SimSource struct {
	e             *sim.Engine
	layers, psize int
}

var (
	_ transfer.BlockSource      = (*SimSource)(nil)
	_ transfer.BlockViewer      = (*SimSource)(nil)
	_ transfer.BlockChecksummer = (*SimSource)(nil)
	_ transfer.BlockDomainer    = (*SimSource)(nil)
	_ transfer.HandoffReleaser  = (*SimSource)(nil)
)

// ReleaseHandoff implements transfer.HandoffReleaser: a decode peer is done
// with a prefill answer's pinned blocks (sim.Engine.ReleaseHandoff).
func (s *SimSource) ReleaseHandoff(id string) bool { return s.e.ReleaseHandoff(id) }

// BlockDomain implements transfer.BlockDomainer: the sim keeps the salt
// domain each block was computed or inserted under.
func (s *SimSource) BlockDomain(hash uint64) (uint64, bool) {
	return s.e.BlockDomain(kv.SeqHash(hash))
}

// NewSimSource wraps e.
func NewSimSource(e *sim.Engine) *SimSource {
	c := e.SimConfig()
	return &SimSource{e: e, layers: c.Layers, psize: c.PayloadSize}
}

// Pin implements transfer.BlockSource.
// The sim names its blocks by sequence hash: that is the hash transfer carries.
// A read that ends with a pinned prefill handoff's last block releases
// that handoff (sim.Engine.HandoffServed).
func (s *SimSource) Pin(hashes []uint64) (int, func()) {
	seq := kv.AsHashes[kv.SeqHash](hashes)
	n, release := s.e.Pin(seq)
	if n == 0 {
		return n, release
	}
	return n, func() {
		release()
		s.e.HandoffServed(seq[:n])
	}
}

// ViewBlock implements transfer.BlockViewer: the pinned block's payload,
// aliasing the engine's memory, valid until the pin is released.
func (s *SimSource) ViewBlock(hash uint64) ([]byte, error) { return s.e.ViewBlock(kv.SeqHash(hash)) }

// BlockChecksum implements transfer.BlockChecksummer.
func (s *SimSource) BlockChecksum(hash uint64) (uint64, bool) {
	return s.e.BlockChecksum(kv.SeqHash(hash))
}

// ReadBlock implements transfer.BlockSource: a copy of every layer, taken
// under the engine's lock (it needs no pin). The server prefers ViewBlock.
func (s *SimSource) ReadBlock(hash uint64, dst []byte) ([]byte, error) {
	start := len(dst)
	dst = slices.Grow(dst, s.layers*s.psize)[:start+s.layers*s.psize]
	for l := range s.layers {
		off := start + l*s.psize
		if _, err := s.e.ReadPayload(kv.SeqHash(hash), l, dst[off:off+s.psize]); err != nil {
			return dst[:start], err
		}
	}
	return dst, nil
}
