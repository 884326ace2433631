package kvbm

import "github.com/kvmesh/kvmesh/kv"

// putAsync queues object slot o's write (allocated, pinned, slotWriting):
// the slot stays pinned and unfindable until settle sees the write done.
func (m *Manager) putAsync(o int32, src []byte, meta BlockMeta) {
	if !m.async.PutAsync(int(o), src, meta) {
		m.obj.release(o)
		m.st.DroppedObject++
		return
	}
	m.objPending[meta.Seq] = o
}

// Settle registers the object-tier blocks whose asynchronous writes have
// completed and been verified since the last call (with their Stored
// events, medium external) and frees the slots of the ones that failed.
// Offload and Match settle first; an engine that is otherwise idle calls
// it when its object storage signals a completion. It returns the blocks
// registered.
func (m *Manager) Settle() int {
	defer m.ev.flush()
	return m.settle()
}

func (m *Manager) settle() int {
	if m.async == nil || len(m.objPending) == 0 {
		return 0
	}
	m.done = m.async.Completed(m.done[:0])
	n := 0
	for _, r := range m.done {
		o, ok := m.objPending[r.Meta.Seq]
		if !ok || int(o) != r.Slot {
			// Not a write this manager queued: a storage bug.
			m.st.Errors++
			continue
		}
		delete(m.objPending, r.Meta.Seq)
		if r.Err != nil {
			m.obj.release(o)
			m.st.FailedObject++
			m.st.Errors++
			continue
		}
		if m.obj.register(o, r.Meta) {
			m.st.OffloadedObject++
			n++
		}
	}
	clear(m.done)
	return n
}

// PendingObject reports whether h's object write is queued or running.
func (m *Manager) PendingObject(h kv.SeqHash) bool {
	_, ok := m.objPending[h]
	return ok
}
