package transfer

import (
	"bytes"
	"fmt"
	"slices"
	"sync"

	"github.com/kvmesh/kvmesh/kv"
)

// RankSources is an engine's caches as a worker serves them to peers:
// one BlockSource per data-parallel rank, all of one KV layout (Digest).
type RankSources interface {
	DPSize() int
	// RankSource is rank r's cache, or nil when the engine has no rank r.
	RankSource(r int) BlockSource
	Digest() string
}

// BlockSource is what a control endpoint serves from: the engine (or its
// block manager) implements it.
type BlockSource interface {
	// Pin pins the longest contiguous prefix of hashes the source holds so
	// it cannot be evicted while it is sent, and returns the prefix length
	// and a release func (called exactly once, also when n is 0; may be nil
	// when n is 0).
	Pin(hashes []uint64) (n int, release func())
	// ReadBlock appends the payload of a pinned block, every layer
	// concatenated, to dst and returns the extended slice. Every block of
	// one source has the same size.
	ReadBlock(hash uint64, dst []byte) ([]byte, error)
}

// BlockViewer is an optional BlockSource extension for sources that keep
// payloads in memory: ViewBlock returns a pinned block's payload without
// copying it, and the server writes it to the socket directly (writev). The
// slice must stay valid and unchanged until the pin is released; the server
// never modifies it.
type BlockViewer interface {
	ViewBlock(hash uint64) ([]byte, error)
}

// BlockChecksummer is an optional BlockSource extension for sources that
// computed each block's kv.Checksum when they stored it. The server then
// sends that checksum instead of hashing every payload again, which also
// makes a block that rotted in the source's memory fail the target's
// checksum check.
type BlockChecksummer interface {
	BlockChecksum(hash uint64) (sum uint64, ok bool)
}

// BlockDomainer is an optional BlockSource extension for sources that know
// the salt domain each block was stored under (kv.Seed of the request's LoRA
// and cache salt). The server then serves a fetch only the prefix of blocks
// in the fetch's own domain, so no request reads blocks of another tenant's
// salt even if it learned their hashes. A source without it cannot tell
// domains apart and serves by hash alone.
type BlockDomainer interface {
	BlockDomain(hash uint64) (domain uint64, ok bool)
}

// HandoffReleaser is an optional BlockSource extension for sources that
// pin blocks for a disaggregated decode side (a prefill answer's handoff):
// a release frame naming the handoff's id unpins them at once, instead of
// at the source's own expiry. It reports whether a pin was released (false:
// none by that id, e.g. already read, released or expired).
type HandoffReleaser interface {
	ReleaseHandoff(id string) bool
}

// MemSource is an in-memory BlockSource whose payloads are the
// deterministic kv.FillPayload bytes of each (hash, layer). It honours pins:
// a block removed while pinned stays readable until its last pin is
// released.
type MemSource struct {
	layers, layerSize int

	mu      sync.Mutex
	blocks  map[uint64]*memBlock
	domains map[uint64]uint64 // hash → salt domain, for blocks not in kv.BaseSeed's
	pinned  int               // outstanding pins, for tests and leak checks
	corrupt func(hash uint64, payload []byte)
}

type memBlock struct {
	pins    int
	removed bool
}

// NewMemSource returns an empty source with blocks of layers×layerSize bytes.
func NewMemSource(layers, layerSize int) *MemSource {
	if layers < 1 {
		layers = 1
	}
	if layerSize < 1 {
		layerSize = kv.DefaultPayloadSize
	}
	return &MemSource{layers: layers, layerSize: layerSize, blocks: make(map[uint64]*memBlock)}
}

// BlockBytes is the payload size of one block.
func (m *MemSource) BlockBytes() int { return m.layers * m.layerSize }

// Add makes the source hold hashes.
func (m *MemSource) Add(hashes ...uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, h := range hashes {
		if b, ok := m.blocks[h]; ok {
			b.removed = false
			continue
		}
		m.blocks[h] = &memBlock{}
	}
}

// AddInDomain makes the source hold hashes stored under salt domain d
// (kv.Seed of their LoRA and cache salt).
func (m *MemSource) AddInDomain(d uint64, hashes ...uint64) {
	m.Add(hashes...)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.domains == nil {
		m.domains = map[uint64]uint64{}
	}
	for _, h := range hashes {
		m.domains[h] = d
	}
}

// BlockDomain implements BlockDomainer: blocks added by Add are in
// kv.BaseSeed's domain.
func (m *MemSource) BlockDomain(hash uint64) (uint64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.blocks[hash]; !ok {
		return 0, false
	}
	if d, ok := m.domains[hash]; ok {
		return d, true
	}
	return kv.BaseSeed, true
}

// Remove evicts hashes; pinned blocks go when their last pin is released.
func (m *MemSource) Remove(hashes ...uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, h := range hashes {
		b, ok := m.blocks[h]
		if !ok {
			continue
		}
		if b.pins > 0 {
			b.removed = true
			continue
		}
		delete(m.blocks, h)
		delete(m.domains, h)
	}
}

// Has reports whether the source holds h (and it is not pending removal).
func (m *MemSource) Has(h uint64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.blocks[h]
	return ok && !b.removed
}

// Pins is the number of outstanding Pin calls not yet released.
func (m *MemSource) Pins() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pinned
}

// SetCorrupt installs a hook that may alter a payload after it is read:
// tests use it to model a source whose memory went bad.
func (m *MemSource) SetCorrupt(f func(hash uint64, payload []byte)) {
	m.mu.Lock()
	m.corrupt = f
	m.mu.Unlock()
}

// Pin implements BlockSource.
func (m *MemSource) Pin(hashes []uint64) (int, func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, h := range hashes {
		b, ok := m.blocks[h]
		if !ok || b.removed {
			break
		}
		n++
	}
	held := append([]uint64(nil), hashes[:n]...)
	for _, h := range held {
		m.blocks[h].pins++
	}
	m.pinned++
	var once sync.Once
	return n, func() {
		once.Do(func() {
			m.mu.Lock()
			defer m.mu.Unlock()
			m.pinned--
			for _, h := range held {
				b := m.blocks[h]
				b.pins--
				if b.pins == 0 && b.removed {
					delete(m.blocks, h)
					delete(m.domains, h)
				}
			}
		})
	}
}

// ReadBlock implements BlockSource.
func (m *MemSource) ReadBlock(hash uint64, dst []byte) ([]byte, error) {
	m.mu.Lock()
	_, ok := m.blocks[hash]
	corrupt := m.corrupt
	m.mu.Unlock()
	if !ok {
		return dst, fmt.Errorf("block %016x not held", hash)
	}
	start := len(dst)
	size := m.layers * m.layerSize
	dst = slices.Grow(dst, size)[:start+size]
	for l := 0; l < m.layers; l++ {
		kv.FillPayload(dst[start+l*m.layerSize:start+(l+1)*m.layerSize], kv.SeqHash(hash), l)
	}
	if corrupt != nil {
		corrupt(hash, dst[start:])
	}
	return dst, nil
}

// PayloadVerifier returns a FetchRequest.Verify func that checks every
// layer of a block against its kv.FillPayload derivation (layers of
// layerSize bytes). The checksum is already verified by the client; this
// proves the bytes are the block's own, not merely intact.
func PayloadVerifier(layers, layerSize int) func(hash uint64, payload []byte) error {
	pool := sync.Pool{New: func() any { b := make([]byte, layerSize); return &b }}
	return func(hash uint64, payload []byte) error {
		if len(payload) != layers*layerSize {
			return fmt.Errorf("block %016x: %d bytes, want %d layers × %d", hash, len(payload), layers, layerSize)
		}
		bp := pool.Get().(*[]byte)
		defer pool.Put(bp)
		want := *bp
		for l := 0; l < layers; l++ {
			got := payload[l*layerSize : (l+1)*layerSize]
			kv.FillPayload(want, kv.SeqHash(hash), l)
			if !bytes.Equal(got, want) {
				// kv.VerifyPayload names the first differing byte.
				return kv.VerifyPayload(got, kv.SeqHash(hash), l, kv.Checksum(got))
			}
		}
		return nil
	}
}
