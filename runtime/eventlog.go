package runtime

import (
	"slices"
	"sync"

	"github.com/kvmesh/kvmesh/index/ref"
	"github.com/kvmesh/kvmesh/kv"
)

// LocalIndex is the worker's own view of what it holds, used to answer Dump.
type LocalIndex interface {
	Apply(kv.Event)
	// Dump re-emits w's holdings as Stored events (ID 0) that rebuild them
	// when applied in order to an empty index.
	Dump(w kv.WorkerKey) []kv.Event
}

// DefaultRingSize is how many recent events per worker key an EventLog keeps.
const DefaultRingSize = 8192

// EventLog is the worker side of the event plane: it stamps each engine
// event with the instance id and the next per-key event id, keeps a ring of
// recent events per key for range queries and feeds a local index for
// dumps. Safe for concurrent use.
type EventLog struct {
	mu       sync.Mutex
	instance uint64
	size     int
	keys     map[uint32]*keyRing
	idx      LocalIndex
}

type keyRing struct {
	last uint64
	ring []kv.Event // event id i lives at ring[i%len]
}

// NewEventLog returns an empty log for instance; ringSize ≤ 0 means
// DefaultRingSize, idx nil means a fresh NewRefLocalIndex.
func NewEventLog(instance uint64, ringSize int, idx LocalIndex) *EventLog {
	if ringSize <= 0 {
		ringSize = DefaultRingSize
	}
	if idx == nil {
		idx = NewRefLocalIndex()
	}
	return &EventLog{instance: instance, size: ringSize, keys: map[uint32]*keyRing{}, idx: idx}
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
		l.idx.Apply(*e)
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
// reflect.
func (l *EventLog) Dump(w kv.WorkerKey) ([]kv.Event, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var last uint64
	if k := l.keys[w.DPRank]; k != nil {
		last = k.last
	}
	if w.Instance != l.instance {
		return nil, last
	}
	return l.idx.Dump(w), last
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

// RefLocalIndex is a LocalIndex on the reference index model (index/ref),
// whose semantics the router's index reproduces.
type RefLocalIndex struct{ *ref.Index }

// NewRefLocalIndex returns an empty RefLocalIndex.
func NewRefLocalIndex() RefLocalIndex { return RefLocalIndex{ref.New()} }

// Dump walks w's holdings in path order (parents before children) and emits
// chains of blocks with equal tier sets as one Stored event per tier.
//
// A holding whose parent block the worker no longer holds (its parent was
// removed, or rebound by a colliding store) cannot be placed by engine hash
// alone: the dump stores placeholder ancestors under unused engine hashes
// and removes them again at the end, so the rebuilt holdings are exactly the
// worker's.
func (r RefLocalIndex) Dump(w kv.WorkerKey) []kv.Event {
	hs := r.Holdings(w)
	if len(hs) == 0 {
		return nil
	}
	used := make(map[uint64]bool, len(hs))
	for _, h := range hs {
		used[h.Engine] = true
	}
	var nextSynth uint64 = 1 << 63
	synth := func() uint64 {
		for used[nextSynth] {
			nextSynth++
		}
		used[nextSynth] = true
		return nextSynth
	}
	var placeholders []uint64

	engineOf := make(map[string]uint64, len(hs))
	var out []kv.Event
	var chain []kv.StoredBlock
	var chainParent uint64
	var chainHasParent bool
	var chainMask uint8
	var chainPath []kv.LocalHash
	flush := func() {
		for t := range kv.NumTiers {
			if chainMask&(1<<t) == 0 {
				continue
			}
			e := kv.Event{Worker: w, Tier: kv.Tier(t), Kind: kv.EventStored,
				HasParent: chainHasParent, Parent: chainParent, Blocks: slices.Clone(chain)}
			out = append(out, e)
		}
		chain = chain[:0]
	}
	for _, h := range hs {
		n := len(h.Path)
		var parent uint64
		hasParent := n > 1
		if hasParent {
			p, ok := engineOf[pathKey(h.Path[:n-1])]
			if !ok {
				// Find the deepest held ancestor, then place
				// placeholders down to the parent.
				d := n - 2
				for d > 0 {
					if _, ok := engineOf[pathKey(h.Path[:d])]; ok {
						break
					}
					d--
				}
				ph := kv.Event{Worker: w, Tier: kv.TierDevice, Kind: kv.EventStored}
				if d > 0 {
					ph.HasParent, ph.Parent = true, engineOf[pathKey(h.Path[:d])]
				}
				for i := d; i < n-1; i++ {
					e := synth()
					ph.Blocks = append(ph.Blocks, kv.StoredBlock{EngineHash: e, LocalHash: h.Path[i]})
					engineOf[pathKey(h.Path[:i+1])] = e
					placeholders = append(placeholders, e)
				}
				if len(chain) > 0 {
					flush()
				}
				out = append(out, ph)
				p = ph.Blocks[len(ph.Blocks)-1].EngineHash
			}
			parent = p
		}
		engineOf[pathKey(h.Path)] = h.Engine
		blk := kv.StoredBlock{EngineHash: h.Engine, LocalHash: h.Path[n-1]}
		if len(chain) > 0 && h.Tiers == chainMask && n == len(chainPath)+1 &&
			hasParent && parent == chain[len(chain)-1].EngineHash && slices.Equal(h.Path[:n-1], chainPath) {
			chain = append(chain, blk)
			chainPath = h.Path
			continue
		}
		if len(chain) > 0 {
			flush()
		}
		chain = append(chain, blk)
		chainParent, chainHasParent, chainMask, chainPath = parent, hasParent, h.Tiers, h.Path
	}
	if len(chain) > 0 {
		flush()
	}
	if len(placeholders) > 0 {
		out = append(out, kv.Removed(w, kv.TierDevice, placeholders))
	}
	return out
}

func pathKey(p []kv.LocalHash) string {
	b := make([]byte, 8*len(p))
	for i, h := range p {
		for j := range 8 {
			b[8*i+j] = byte(h >> (8 * j))
		}
	}
	return string(b)
}
