package kvbm

import "github.com/kvmesh/kvmesh/kv"

// Inventory lists the blocks the host, disk and object tiers hold as Stored events
// (one block each, parents before their children within a tier), for a
// dump: applied in order to an index that lacks them they rebuild what the
// tiers' events built. Events carry worker and no ids.
func (m *Manager) Inventory(worker kv.WorkerKey) []kv.Event {
	var evs []kv.Event
	for _, p := range []*pool{m.host, m.disk, m.obj} {
		if p == nil {
			continue
		}
		done := make(map[kv.SeqHash]bool, p.byHash.Len())
		var visit func(s int32)
		visit = func(s int32) {
			meta := p.slots[s].meta
			if done[meta.Seq] {
				return
			}
			done[meta.Seq] = true
			if meta.HasParent {
				if ps, ok := p.byHash.Get(meta.Parent); ok {
					visit(ps)
				}
			}
			e := kv.Event{Worker: worker, Tier: p.tier, Kind: kv.EventStored, HasParent: meta.HasParent,
				Blocks: []kv.StoredBlock{{EngineHash: kv.EngineHash(meta.Seq), LocalHash: meta.Local}}}
			if meta.HasParent {
				e.Parent = kv.EngineHash(meta.Parent)
			}
			evs = append(evs, e)
		}
		for i := range p.slots {
			if p.slots[i].state == slotRegistered {
				visit(int32(i))
			}
		}
	}
	return evs
}
