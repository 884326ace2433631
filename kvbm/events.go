package kvbm

import "github.com/kvmesh/kvmesh/kv"

// EventSink receives the manager's KV events in order, one batch per call
// that changed a tier. It may keep the batch.
type EventSink func(batch []kv.Event)

// eventLog batches the events of one public call: consecutive stores of one
// chain on one tier become one Stored event, consecutive removals on one
// tier one Removed event. An eviction while a chain is being stored (a full
// tier evicts a block per block it stores) goes ahead of that chain's open
// Stored event when it names none of the chain's blocks nor its parent,
// where it commutes; so the chain stays one event. Ids are given at flush.
type eventLog struct {
	sink   EventSink
	worker kv.WorkerKey
	nextID uint64
	batch  []kv.Event
}

func (l *eventLog) stored(t kv.Tier, m BlockMeta) {
	if l.sink == nil {
		return
	}
	b := kv.StoredBlock{EngineHash: kv.EngineHash(m.Seq), LocalHash: m.Local}
	if n := len(l.batch); n > 0 {
		e := &l.batch[n-1]
		if e.Kind == kv.EventStored && e.Tier == t && m.HasParent &&
			e.Blocks[len(e.Blocks)-1].EngineHash == kv.EngineHash(m.Parent) {
			e.Blocks = append(e.Blocks, b)
			return
		}
	}
	var parent *kv.EngineHash
	if m.HasParent {
		p := kv.EngineHash(m.Parent)
		parent = &p
	}
	l.batch = append(l.batch, kv.Stored(l.worker, t, parent, []kv.StoredBlock{b}))
}

func (l *eventLog) removed(t kv.Tier, h kv.SeqHash) {
	if l.sink == nil {
		return
	}
	eng := kv.EngineHash(h)
	n := len(l.batch)
	if n > 0 {
		e := &l.batch[n-1]
		if e.Kind == kv.EventRemoved && e.Tier == t {
			e.Removed = append(e.Removed, eng)
			return
		}
		if e.Kind == kv.EventStored && e.Tier == t && commutes(e, eng) {
			if n > 1 && l.batch[n-2].Kind == kv.EventRemoved && l.batch[n-2].Tier == t {
				l.batch[n-2].Removed = append(l.batch[n-2].Removed, eng)
				return
			}
			l.batch = append(l.batch, kv.Event{})
			copy(l.batch[n:], l.batch[n-1:n])
			l.batch[n-1] = kv.Removed(l.worker, t, []kv.EngineHash{eng})
			return
		}
	}
	l.batch = append(l.batch, kv.Removed(l.worker, t, []kv.EngineHash{eng}))
}

// commutes reports whether removing eng may move ahead of Stored event e.
func commutes(e *kv.Event, eng kv.EngineHash) bool {
	if e.HasParent && e.Parent == eng {
		return false
	}
	for _, b := range e.Blocks {
		if b.EngineHash == eng {
			return false
		}
	}
	return true
}

func (l *eventLog) flush() {
	if len(l.batch) == 0 || l.sink == nil {
		return
	}
	b := l.batch
	l.batch = nil
	for i := range b {
		l.nextID++
		b[i].ID = l.nextID
	}
	l.sink(b)
}
