package index

import (
	"sort"

	"github.com/kvmesh/kvmesh/kv"
)

// Dump returns w's holdings as synthetic Stored events, one chain per path
// and tier, in an order that applies cleanly to a fresh index and rebuilds
// identical holdings (same paths, tiers and engine hashes). A block whose
// ancestor w holds on no tier (a hole left by a remove) is reached by
// storing the missing ancestors under unused engine hashes and removing them
// again: those Removed events come last. Event IDs are left zero. Dump scans
// every node; it is meant for gap repair and snapshots, not the hot path.
func (ix *Index) Dump(w kv.WorkerKey) []kv.Event {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ws := ix.workers[w]
	if ws == nil {
		return nil
	}
	type held struct {
		id    uint32
		m     uint8
		depth int
	}
	var hs []held
	ix.forEachHeld(ws.slot, func(id uint32, m uint8) { hs = append(hs, held{id: id, m: m}) })
	d := *ix.dir.Load()
	depthMemo := map[uint32]int{0: 0}
	var depthOf func(id uint32) int
	depthOf = func(id uint32) int {
		// Iterative walk up to the first memoised ancestor.
		var path []uint32
		for {
			if dd, ok := depthMemo[id]; ok {
				if len(path) == 0 {
					return dd
				}
				for i := len(path) - 1; i >= 0; i-- {
					dd++
					depthMemo[path[i]] = dd
				}
				return depthMemo[path[0]]
			}
			path = append(path, id)
			id = parentOf(nodeAt(d, id).pg.Load())
		}
	}
	for i := range hs {
		hs[i].depth = depthOf(hs[i].id)
	}
	sort.Slice(hs, func(i, j int) bool {
		if hs[i].depth != hs[j].depth {
			return hs[i].depth < hs[j].depth
		}
		return hs[i].id < hs[j].id
	})
	hash := map[uint32]uint64{} // nodes present in the rebuilt state -> engine hash
	used := map[uint64]bool{}
	for _, h := range hs {
		e := ix.engineOf(ws, h.id)
		hash[h.id] = e
		used[e] = true
	}
	present := map[uint32]bool{0: true}
	var evs []kv.Event
	open := map[[2]uint32]int{} // (tier, last node) -> event index
	var synth [kv.NumTiers][]uint64
	for _, h := range hs {
		parent := parentOf(nodeAt(d, h.id).pg.Load())
		for t := kv.Tier(0); t < kv.NumTiers; t++ {
			if h.m&(1<<t) == 0 {
				continue
			}
			if !present[parent] {
				// Synthesise the missing ancestors down to parent.
				var miss []uint32
				a := parent
				for !present[a] {
					miss = append(miss, a)
					a = parentOf(nodeAt(d, a).pg.Load())
				}
				ev := kv.Event{Worker: w, Tier: t, Kind: kv.EventStored}
				if a != 0 {
					ev.HasParent, ev.Parent = true, kv.EngineHash(hash[a])
				}
				for i := len(miss) - 1; i >= 0; i-- {
					n := miss[i]
					e := ix.chunkOf(n).eng[n&chunkMask]
					for used[e] {
						e++
					}
					used[e] = true
					hash[n] = e
					present[n] = true
					ev.Blocks = append(ev.Blocks, kv.StoredBlock{EngineHash: kv.EngineHash(e), LocalHash: kv.LocalHash(nodeAt(d, n).local.Load())})
					synth[t] = append(synth[t], e)
				}
				evs = append(evs, ev)
				open[[2]uint32{uint32(t), parent}] = len(evs) - 1
			}
			blk := kv.StoredBlock{EngineHash: kv.EngineHash(hash[h.id]), LocalHash: kv.LocalHash(nodeAt(d, h.id).local.Load())}
			if i, ok := open[[2]uint32{uint32(t), parent}]; ok {
				evs[i].Blocks = append(evs[i].Blocks, blk)
				delete(open, [2]uint32{uint32(t), parent})
				open[[2]uint32{uint32(t), h.id}] = i
				continue
			}
			ev := kv.Event{Worker: w, Tier: t, Kind: kv.EventStored, Blocks: []kv.StoredBlock{blk}}
			if parent != 0 {
				ev.HasParent, ev.Parent = true, kv.EngineHash(hash[parent])
			}
			evs = append(evs, ev)
			open[[2]uint32{uint32(t), h.id}] = len(evs) - 1
		}
		present[h.id] = true
	}
	for t := kv.Tier(0); t < kv.NumTiers; t++ {
		if len(synth[t]) > 0 {
			evs = append(evs, kv.Removed(w, t, kv.AsHashes[kv.EngineHash](synth[t])))
		}
	}
	return evs
}

// EngineHashes appends to dst the engine hashes w stored the leading blocks
// of the query local under (its own hash domain, from its events), stopping
// at the first block w holds on no tier. A KV hint names the source's blocks
// this way. It takes the writers' lock, since engine hashes are writer-only
// memory: it is meant for the decisions that plan a hint, not every lookup.
func (ix *Index) EngineHashes(w kv.WorkerKey, local []kv.LocalHash, dst []kv.EngineHash) []kv.EngineHash {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ws := ix.workers[w]
	if ws == nil {
		return dst
	}
	// Under the writer lock nothing changes, so the walk needs none of the
	// readers' validation: it tries each node's successor (the child in
	// almost every chain, next in memory) before the child table, and looks
	// for w only where the holders word differs from the level above's (the
	// same word means the same holders, as in FindMatches).
	dir := *ix.dir.Load()
	exc := len(ws.over) > 0
	var parent uint32
	var above uint64
	for i, l := range local {
		id := parent + 1
		var c *chunk
		var n *hot
		if ci := int(id >> chunkBits); ci < len(dir) {
			c = dir[ci]
			n = &c.hot[id&chunkMask]
		}
		if n == nil || parentOf(n.pg.Load()) != parent || n.local.Load() != uint64(l) {
			if id = ix.findChild(parent, uint64(l)); id == 0 {
				break
			}
			c = dir[id>>chunkBits]
			n = &c.hot[id&chunkMask]
		}
		if holders := n.holders.Load(); i == 0 || holders != above {
			if maskIn(ix, holders, ws.slot) == 0 {
				break
			}
			above = holders
		}
		e := c.eng[id&chunkMask]
		if exc {
			if o, ok := ws.over[id]; ok {
				e = o
			}
		}
		dst = append(dst, kv.EngineHash(e))
		parent = id
	}
	return dst
}
