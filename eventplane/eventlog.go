package eventplane

import (
	"errors"
	"sync"

	"github.com/kvmesh/kvmesh/kv"
)

// Holdings lists what the worker holds, to answer Dump: the engine's
// inventory (engine.Inventory): the sim's block table, or for a remote
// engine what its relayed KV events built.
type Holdings interface {
	// Holdings returns w's holdings as Stored events (ID 0) that rebuild
	// them when applied in order to an empty index, or false when they
	// cannot be listed. It calls mark once, where the list is exact with
	// respect to w's events: every event appended to the log before mark is
	// reflected, none appended after.
	Holdings(w kv.WorkerKey, mark func()) ([]kv.Event, bool)
}

// DefaultRingSize is how many recent events per worker key an EventLog keeps.
const DefaultRingSize = 8192

// EventLog is the worker side of the event plane: it stamps each engine
// event with the instance id and the next per-key event id, keeps a ring of
// recent events per key for range queries and answers dumps from the
// engine's holdings. Safe for concurrent use.
type EventLog struct {
	mu       sync.Mutex
	instance uint64
	size     int
	keys     map[uint32]*keyRing
	holdings Holdings // nil: no dumps
}

type keyRing struct {
	last uint64
	ring []kv.Event // event id i lives at ring[i%len]
}

// NewEventLog returns an empty log for instance whose dumps list h (nil:
// the worker cannot list its holdings, see Dump); ringSize ≤ 0 means
// DefaultRingSize.
func NewEventLog(instance uint64, ringSize int, h Holdings) (*EventLog, error) {
	if ringSize <= 0 {
		ringSize = DefaultRingSize
	}
	if instance == 0 {
		return nil, errors.New("event log: zero instance id")
	}
	return &EventLog{instance: instance, size: ringSize, keys: map[uint32]*keyRing{}, holdings: h}, nil
}

// Append stamps and records a batch (in place: batch[i].ID and
// batch[i].Worker.Instance are set) and then, still under the log's lock so
// that publication order equals id order, calls publish with it if non-nil.
// The log keeps the events: callers must not modify them afterwards.
func (l *EventLog) Append(batch []kv.Event, publish func([]kv.Event)) {
	if len(batch) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range batch {
		e := &batch[i]
		e.Worker.Instance = l.instance
		k := l.keys[e.Worker.DPRank]
		if k == nil {
			k = &keyRing{ring: make([]kv.Event, l.size)}
			l.keys[e.Worker.DPRank] = k
		}
		k.last++
		e.ID = k.last
		k.ring[e.ID%uint64(l.size)] = *e
	}
	if publish != nil {
		publish(batch)
	}
}

// RangeResult describes a Range answer.
type RangeResult struct {
	// TooOld: from is no longer in the ring; ask for a Dump.
	TooOld bool
	// TooNew: to is past the last event produced.
	TooNew bool
	// Last is the last event id produced for the key.
	Last uint64
}

// Range returns copies of the events of key with from ≤ id ≤ to, at most
// limit of them (limit ≤ 0: no limit), oldest first.
func (l *EventLog) Range(w kv.WorkerKey, from, to uint64, limit int) ([]kv.Event, RangeResult) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.keys[w.DPRank]
	var res RangeResult
	if k != nil {
		res.Last = k.last
	}
	if w.Instance != l.instance || from == 0 || from > to {
		return nil, res
	}
	if to > res.Last {
		res.TooNew = true
		to = res.Last
	}
	if from > to {
		return nil, res
	}
	oldest := uint64(1)
	if res.Last > uint64(l.size) {
		oldest = res.Last - uint64(l.size) + 1
	}
	if from < oldest {
		res.TooOld = true
		return nil, res
	}
	n := to - from + 1
	if limit > 0 && n > uint64(limit) {
		n = uint64(limit)
	}
	out := make([]kv.Event, 0, n)
	for id := from; id < from+n; id++ {
		out = append(out, k.ring[id%uint64(l.size)])
	}
	return out, res
}

// Dump returns key's holdings as Stored events and the last event id they
// reflect, or ok false when the holdings cannot be listed (no Holdings):
// then last is the last event id, and a caller that applies the empty dump
// clears the key's holdings and relearns them from the events after it.
func (l *EventLog) Dump(w kv.WorkerKey) (evs []kv.Event, last uint64, ok bool) {
	switch {
	case w.Instance != l.instance:
		return nil, l.LastID(w.DPRank), true // another instance's key: nothing held here
	case l.holdings == nil:
		return nil, l.LastID(w.DPRank), false
	}
	// Not under l.mu: the holdings' mark runs where the engine delivers
	// events, which then append under l.mu.
	evs, ok = l.holdings.Holdings(w, func() { last = l.LastID(w.DPRank) })
	if !ok {
		return nil, l.LastID(w.DPRank), false
	}
	for i := range evs {
		evs[i].Worker = w // stamped as Append stamps events
	}
	return evs, last, true
}

// LastID is the last event id produced for a key.
func (l *EventLog) LastID(dpRank uint32) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if k := l.keys[dpRank]; k != nil {
		return k.last
	}
	return 0
}
