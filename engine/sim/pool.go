package sim

import (
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/internal/u64map"
	"github.com/kvmesh/kvmesh/kv"
)

const (
	flagRegistered uint8 = 1 << iota // has a sequence hash, findable by lookups
	flagHasParent
	flagUnfilled // payload not written yet: derived from seq on first read (fill)
)

// block is one slot of the paged KV pool. A block is in exactly one state:
// referenced (ref > 0), cached and idle (registered, ref 0, on the LRU list),
// or free (unregistered, ref 0, on the free stack).
type block struct {
	seq, parent kv.SeqHash
	local       kv.LocalHash
	ref         int32
	prev, next  int32 // LRU links, -1 at the ends
	flags       uint8
}

// pool is the paged KV pool with prefix caching. All payload bytes live in
// one slab: block i, layer l is slab[(i·layers+l)·payloadSize:][:payloadSize].
type pool struct {
	blocks           []block
	free             []int32 // stack; the next allocation pops the end
	lruHead, lruTail int32   // head is the least recently freed (evicted first)
	lruLen           int
	used             int // blocks with ref > 0
	evicted          uint64
	byHash           u64map.Map[kv.SeqHash, int32]
	layers, psize    int
	slab             []byte
	sums             []uint64 // kv.Checksum of each block's payload as stored, when kept (view.go)
	domains          []uint64 // each registered block's salt domain: kv.Seed of its request's LoRA and salt
	ev               *eventLog
	touched          uint64 // keeps warm's loads
	// version changes with every change of a block's reference count,
	// registration or place (acquire, release, alloc, register).
	version uint64
}

func newPool(n, layers, psize int, ev *eventLog) pool {
	p := pool{
		blocks:  make([]block, n),
		free:    make([]int32, n),
		lruHead: -1, lruTail: -1,
		byHash: u64map.New[kv.SeqHash, int32](n),
		layers: layers, psize: psize,
		slab:    make([]byte, n*layers*psize),
		domains: make([]uint64, n),
		ev:      ev,
	}
	for i := range p.free {
		p.free[i] = int32(n - 1 - i) // block 0 is allocated first
		p.blocks[i].prev, p.blocks[i].next = -1, -1
	}
	return p
}

// available is how many blocks an allocation can obtain: free plus idle
// cached blocks (which it would evict).
func (p *pool) available() int { return len(p.free) + p.lruLen }

func (p *pool) lruRemove(id int32) {
	b := &p.blocks[id]
	if b.prev >= 0 {
		p.blocks[b.prev].next = b.next
	} else {
		p.lruHead = b.next
	}
	if b.next >= 0 {
		p.blocks[b.next].prev = b.prev
	} else {
		p.lruTail = b.prev
	}
	b.prev, b.next = -1, -1
	p.lruLen--
}

func (p *pool) lruPush(id int32) {
	b := &p.blocks[id]
	b.prev, b.next = p.lruTail, -1
	if p.lruTail >= 0 {
		p.blocks[p.lruTail].next = id
	} else {
		p.lruHead = id
	}
	p.lruTail = id
	p.lruLen++
}

// acquire adds a reference to a cached block, taking it off the LRU list if
// it was idle.
func (p *pool) acquire(id int32) {
	p.version++
	b := &p.blocks[id]
	if b.ref == 0 {
		p.lruRemove(id)
		p.used++
	}
	b.ref++
}

// release drops a reference; an idle registered block becomes the most
// recently used cached block, an idle unregistered one is free.
func (p *pool) release(id int32) {
	p.version++
	b := &p.blocks[id]
	b.ref--
	if b.ref > 0 {
		return
	}
	p.used--
	if b.flags&flagRegistered != 0 {
		p.lruPush(id)
	} else {
		b.flags = 0 // a shadow block's pending fill
		p.free = append(p.free, id)
	}
}

// warmEvict touches the table slots of the next n evictions (after the
// free blocks run out), so that their deletes' cache misses overlap.
func (p *pool) warmEvict(n int) {
	var t kv.SeqHash
	for id := p.lruHead; n > len(p.free) && id >= 0; n-- {
		b := &p.blocks[id]
		t += p.byHash.Touch(b.seq)
		id = b.next
	}
	p.touched += uint64(t)
}

// warm touches the table slots of lookups of seqs.
func (p *pool) warm(seqs []kv.SeqHash) {
	var t kv.SeqHash
	for _, h := range seqs {
		t += p.byHash.Touch(h)
	}
	p.touched += uint64(t)
}

// alloc takes a free block, or evicts the least recently used idle cached
// block (emitting Removed). The block comes back with one reference.
func (p *pool) alloc() (int32, bool) {
	p.version++
	var id int32
	if n := len(p.free); n > 0 {
		id = p.free[n-1]
		p.free = p.free[:n-1]
	} else if p.lruHead >= 0 {
		id = p.lruHead
		p.lruRemove(id)
		b := &p.blocks[id]
		p.byHash.Delete(b.seq)
		b.flags = 0
		p.evicted++
		p.ev.removed(kv.EngineHash(b.seq))
	} else {
		return -1, false
	}
	p.blocks[id].ref = 1
	p.used++
	return id, true
}

// register makes a referenced, unregistered block findable under seq.
func (p *pool) register(id int32, seq kv.SeqHash, local kv.LocalHash, parent kv.SeqHash, hasParent bool, fill bool) {
	p.version++
	b := &p.blocks[id]
	b.seq, b.local, b.parent = seq, local, parent
	b.flags = flagRegistered
	if hasParent {
		b.flags |= flagHasParent
	}
	p.byHash.Set(seq, id)
	if fill && p.layers*p.psize > 0 {
		// Most computed blocks are never read (only peers fetch them), so
		// their derived bytes are written on the first read instead.
		b.flags |= flagUnfilled
	}
}

// shadow gives a referenced, unregistered block seq's bytes (derived on
// first read) without making it findable: a duplicate of a cached block.
func (p *pool) shadow(id int32, seq kv.SeqHash) {
	b := &p.blocks[id]
	b.seq = seq
	if p.layers*p.psize > 0 {
		b.flags |= flagUnfilled
	}
}

// fill writes block id's payload (and its stored checksum) if register
// deferred it. Every read of a block's bytes or checksum goes through it.
func (p *pool) fill(id int32) {
	b := &p.blocks[id]
	if b.flags&flagUnfilled == 0 {
		return
	}
	b.flags &^= flagUnfilled
	for l := 0; l < p.layers; l++ {
		kv.FillPayload(p.payload(id, l), b.seq, l)
	}
	p.storeSum(id)
}

func (p *pool) payload(id int32, layer int) []byte {
	off := (int(id)*p.layers + layer) * p.psize
	return p.slab[off : off+p.psize : off+p.psize]
}

// match counts the leading hashes that are cached, appending their block ids
// to ids.
func (p *pool) match(seqs []kv.SeqHash, ids []int32) (int, []int32) {
	for i, h := range seqs {
		id, ok := p.byHash.Get(h)
		if !ok {
			return i, ids
		}
		ids = append(ids, id)
	}
	return len(seqs), ids
}

// eventLog batches a core's KV events for one flush, coalescing runs: the
// consecutive blocks of one chain become one Stored event, consecutive
// evictions one Removed event. An eviction while a chain is being stored
// (a chain allocating as it goes evicts a block per block) is moved ahead
// of that chain's still open Stored event, where it commutes unless it
// names one of the chain's blocks or its parent; so such a chain stays one
// event instead of alternating one-block events. Otherwise order is
// preserved. Each flush hands the sink freshly allocated slices, so a sink
// may keep them, unless the sink is transient: then the log reuses them.
type eventLog struct {
	sink       engine.EventSink
	transient  bool // the sink keeps nothing: reuse the slices after it returns
	omitTokens bool
	worker     kv.WorkerKey
	nextID     uint64

	events  []kv.Event
	blocks  []kv.StoredBlock
	toks    []kv.Token
	removes []kv.EngineHash

	run                  uint8 // 0 none, 1 stored, 2 removed
	runTokOK             bool  // every block of the stored run had its tokens
	runStart, runTokFrom int
	runHasParent         bool
	runParent, runLast   kv.EngineHash
	runLoRA, runSalt     string
	hoistEnd             int // len(removes) when the last Removed event ended
}

const (
	runNone uint8 = iota
	runStored
	runRemoved
)

// stored and removed take the sim's engine hashes, which are its sequence
// hashes (the sim, like vLLM, names a block by its chained hash).
func (l *eventLog) stored(parent kv.EngineHash, hasParent bool, eng kv.EngineHash, local kv.LocalHash, toks []kv.Token, lora, salt string) {
	if l.sink == nil {
		return
	}
	if !(l.run == runStored && hasParent && parent == l.runLast && lora == l.runLoRA && salt == l.runSalt) {
		l.close()
		l.run, l.runStart, l.runTokFrom = runStored, len(l.blocks), len(l.toks)
		l.runHasParent, l.runParent, l.runLoRA, l.runSalt = hasParent, parent, lora, salt
		l.runTokOK = !l.omitTokens
	}
	l.blocks = append(l.blocks, kv.StoredBlock{EngineHash: eng, LocalHash: local})
	if toks == nil {
		l.runTokOK = false
	}
	if l.runTokOK {
		l.toks = append(l.toks, toks...)
	}
	l.runLast = eng
}

func (l *eventLog) removed(eng kv.EngineHash) {
	if l.sink == nil {
		return
	}
	if l.run == runStored && l.canHoist(eng) {
		// Append to the event just before the open chain if it is a
		// Removed event ending the removal slab, else start one there.
		if k := len(l.events) - 1; k >= 0 && l.events[k].Kind == kv.EventRemoved && l.hoistEnd == len(l.removes) {
			l.removes = append(l.removes, eng)
			rm := l.events[k].Removed
			l.events[k].Removed = l.removes[len(l.removes)-len(rm)-1 : len(l.removes) : len(l.removes)]
		} else {
			l.removes = append(l.removes, eng)
			l.nextID++
			l.events = append(l.events, kv.Event{ID: l.nextID, Worker: l.worker, Tier: kv.TierDevice,
				Kind: kv.EventRemoved, Removed: l.removes[len(l.removes)-1 : len(l.removes) : len(l.removes)]})
		}
		l.hoistEnd = len(l.removes)
		return
	}
	if l.run != runRemoved {
		l.close()
		l.run, l.runStart = runRemoved, len(l.removes)
	}
	l.removes = append(l.removes, eng)
}

// canHoist reports whether evicting eng commutes with the open Stored run.
func (l *eventLog) canHoist(eng kv.EngineHash) bool {
	if l.runHasParent && eng == l.runParent {
		return false
	}
	for _, b := range l.blocks[l.runStart:] {
		if b.EngineHash == eng {
			return false
		}
	}
	return true
}

func (l *eventLog) close() {
	switch l.run {
	case runNone:
		return
	case runStored:
		l.nextID++
		e := kv.Event{ID: l.nextID, Worker: l.worker, Tier: kv.TierDevice, Kind: kv.EventStored,
			HasParent: l.runHasParent, Parent: l.runParent, LoRA: l.runLoRA, Salt: l.runSalt,
			Blocks: l.blocks[l.runStart:len(l.blocks):len(l.blocks)]}
		if l.runTokOK {
			e.Tokens = l.toks[l.runTokFrom:len(l.toks):len(l.toks)]
		} else {
			l.toks = l.toks[:l.runTokFrom] // a run without all its tokens carries none
		}
		l.events = append(l.events, e)
	case runRemoved:
		l.nextID++
		l.events = append(l.events, kv.Event{ID: l.nextID, Worker: l.worker, Tier: kv.TierDevice,
			Kind: kv.EventRemoved, Removed: l.removes[l.runStart:len(l.removes):len(l.removes)]})
		l.hoistEnd = len(l.removes)
	}
	l.run = runNone
}

// flush hands the pending events to the sink as one batch.
func (l *eventLog) flush() {
	l.close()
	if len(l.events) == 0 || l.sink == nil {
		return
	}
	batch, blocks, toks, removes := l.events, l.blocks, l.toks, l.removes
	l.events, l.blocks, l.toks, l.removes, l.hoistEnd = nil, nil, nil, nil, 0
	l.sink(batch)
	// Reuse only when the sink did not make the core log more meanwhile.
	if l.transient && l.events == nil && l.blocks == nil && l.toks == nil && l.removes == nil {
		l.events, l.blocks, l.toks, l.removes = batch[:0], blocks[:0], toks[:0], removes[:0]
	}
}
