package kvbm

import "github.com/kvmesh/kvmesh/kv"

// EventSink receives the manager's KV events in order, one batch per call
// that changed a tier. It may keep the batch.
type EventSink func(batch []kv.Event)

// eventLog batches the events of one public call: consecutive stores of one
// chain on one tier become one Stored event, consecutive removals on one
// tier one Removed event.
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
	l.nextID++
	e := kv.Stored(l.worker, t, parent, []kv.StoredBlock{b})
	e.ID = l.nextID
	l.batch = append(l.batch, e)
}

func (l *eventLog) removed(t kv.Tier, h kv.SeqHash) {
	if l.sink == nil {
		return
	}
	if n := len(l.batch); n > 0 {
		e := &l.batch[n-1]
		if e.Kind == kv.EventRemoved && e.Tier == t {
			e.Removed = append(e.Removed, kv.EngineHash(h))
			return
		}
	}
	l.nextID++
	e := kv.Removed(l.worker, t, []kv.EngineHash{kv.EngineHash(h)})
	e.ID = l.nextID
	l.batch = append(l.batch, e)
}

func (l *eventLog) flush() {
	if len(l.batch) == 0 || l.sink == nil {
		return
	}
	b := l.batch
	l.batch = nil
	l.sink(b)
}
