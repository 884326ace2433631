package kvbm

import (
	"errors"
	"fmt"

	"github.com/kvmesh/kvmesh/kv"
)

// PinHost pins the longest prefix of seqs the host tier holds, appending
// the pinned blocks to dst, so a peer can read them (HostView) while the
// pins last; Release unpins them. Unlike Match it is no sighting for the
// disk filter and counts nothing.
func (m *Manager) PinHost(dst []Staged, seqs []kv.SeqHash) []Staged {
	if m.host == nil {
		return dst
	}
	for _, h := range seqs {
		s, ok := m.host.lookup(h)
		if !ok {
			break
		}
		m.host.acquire(s)
		dst = append(dst, Staged{Tier: kv.TierHost, slot: s, Meta: m.host.slots[s].meta})
	}
	return dst
}

// HostView returns host block h's bytes, aliasing the arena, and the
// checksum it carries. h must be pinned (PinHost, Match): a pinned block is
// neither evicted nor overwritten, so the bytes stay valid and unchanged
// until its last pin is released.
func (m *Manager) HostView(h kv.SeqHash) ([]byte, uint64, error) {
	if m.host == nil {
		return nil, 0, errors.New("kvbm: no host tier")
	}
	s, ok := m.host.lookup(h)
	if !ok {
		return nil, 0, fmt.Errorf("kvbm: block %016x is not in the host tier", uint64(h))
	}
	if m.host.slots[s].ref <= 0 {
		return nil, 0, fmt.Errorf("kvbm: host block %016x is not pinned", uint64(h))
	}
	v, ok := m.host.store.(Viewer)
	if !ok {
		return nil, 0, errors.New("kvbm: the host storage is not addressable")
	}
	return v.View(int(s)), m.host.slots[s].meta.Sum, nil
}
