package sim

import (
	"fmt"
	"slices"

	"github.com/kvmesh/kvmesh/kv"
)

// Lookup counts the leading sequence hashes whose blocks are cached.
func (c *Core) Lookup(seqs []kv.SeqHash) int {
	n, _ := c.pool.match(seqs, nil)
	return n
}

// Pin holds the cached leading blocks of seqs so they cannot be evicted (a
// peer is reading them). It returns how many it holds and a release func,
// which is safe to call more than once.
func (c *Core) Pin(seqs []kv.SeqHash) (int, func()) {
	ids, release := c.pinBlocks(seqs)
	return c.pinTiers(seqs, len(ids), release)
}

// PinBlocks is Pin that also returns the pinned blocks' ids in the pool:
// the physical block ids a vLLM-style P/D connector hands to its peer. An
// id stays the block's while the pin is held.
func (c *Core) PinBlocks(seqs []kv.SeqHash) ([]int32, func()) {
	ids, release := c.pinBlocks(seqs)
	return append([]int32(nil), ids...), release
}

// pinBlocks pins and returns the ids the release func reads: callers must
// not modify them.
func (c *Core) pinBlocks(seqs []kv.SeqHash) ([]int32, func()) {
	_, ids := c.pool.match(seqs, make([]int32, 0, len(seqs)))
	for _, id := range ids {
		c.pool.acquire(id)
	}
	released := false
	return ids, func() {
		if released {
			return
		}
		released = true
		for i := len(ids) - 1; i >= 0; i-- {
			c.pool.release(ids[i])
		}
	}
}

// ReadPayload copies layer's payload of the cached block seq into dst and
// returns the byte count.
func (c *Core) ReadPayload(seq kv.SeqHash, layer int, dst []byte) (int, error) {
	id, ok := c.pool.byHash.Get(seq)
	hv, _, inHost := c.hostView(seq)
	if !ok && !inHost {
		return 0, fmt.Errorf("sim: block %016x is not cached", seq)
	}
	if layer < 0 || layer >= c.cfg.Layers {
		return 0, fmt.Errorf("sim: layer %d out of range [0, %d)", layer, c.cfg.Layers)
	}
	if len(dst) < c.cfg.PayloadSize {
		return 0, fmt.Errorf("sim: payload buffer of %d bytes, need %d", len(dst), c.cfg.PayloadSize)
	}
	if inHost {
		// A pinned host-tier block (Pin serves G2 past the device prefix).
		return copy(dst, hv[layer*c.cfg.PayloadSize:(layer+1)*c.cfg.PayloadSize]), nil
	}
	c.pool.fill(id)
	return copy(dst, c.pool.payload(id, layer)), nil
}

// Insert commits a chain of blocks fetched from elsewhere as idle cached
// blocks (most recently used), emitting Stored for each one not already
// cached. It checks that the chain hangs off a cached parent, that every
// sequence hash chains from its local hash, and every payload byte with
// kv.VerifyPayload. It returns how many leading blocks of the chain are
// cached afterwards; on an error the blocks before the bad one stay.
func (c *Core) Insert(ch Chain) (n int, err error) {
	defer c.ev.flush()
	var prevID int32 = -1
	if ch.HasParent {
		id, ok := c.pool.byHash.Get(ch.Parent)
		if !ok {
			return 0, fmt.Errorf("sim insert: parent block %016x is not cached", ch.Parent)
		}
		prevID = id
	}
	prev, hasPrev := ch.Parent, ch.HasParent
	domain := kv.Seed(ch.LoRA, ch.Salt)
	for i := range ch.Blocks {
		b := &ch.Blocks[i]
		if err := c.checkBlock(b, prev, hasPrev); err != nil {
			return i, fmt.Errorf("sim insert: block %d of %d: %w", i, len(ch.Blocks), err)
		}
		id, ok := c.pool.byHash.Get(b.Seq)
		if !ok {
			// Hold the parent so making room cannot evict it mid-chain.
			if prevID >= 0 {
				c.pool.acquire(prevID)
			}
			id, ok = c.pool.alloc()
			if prevID >= 0 {
				c.pool.release(prevID)
			}
			if !ok {
				return i, fmt.Errorf("sim insert: block %d of %d: %w", i, len(ch.Blocks), ErrNoSpace)
			}
			c.pool.register(id, b.Seq, b.Local, prev, hasPrev, false)
			c.pool.domains[id] = domain
			for l := 0; l < c.cfg.Layers; l++ {
				copy(c.pool.payload(id, l), b.Layers[l])
			}
			c.pool.storeSum(id)
			c.pool.release(id)
			c.counters.InsertedBlocks++
			var toks []kv.Token
			if len(b.Tokens) == c.bs {
				toks = b.Tokens
			}
			c.ev.stored(kv.EngineHash(prev), hasPrev, kv.EngineHash(b.Seq), b.Local, toks, ch.LoRA, ch.Salt)
		}
		prev, hasPrev, prevID = b.Seq, true, id
	}
	return len(ch.Blocks), nil
}

func (c *Core) checkBlock(b *BlockData, prev kv.SeqHash, hasPrev bool) error {
	want := kv.SeqHash(b.Local) // a first block's sequence hash is its local hash
	if hasPrev {
		want = kv.ChainHash(prev, b.Local)
	}
	if b.Seq != want {
		return fmt.Errorf("sequence hash %016x does not chain from local hash %016x (want %016x)", b.Seq, b.Local, want)
	}
	if len(b.Tokens) != 0 && len(b.Tokens) != c.bs {
		return fmt.Errorf("%d tokens, want %d (block size) or none", len(b.Tokens), c.bs)
	}
	if len(b.Layers) != c.cfg.Layers || len(b.Sums) != c.cfg.Layers {
		return fmt.Errorf("%d layers and %d checksums, want %d", len(b.Layers), len(b.Sums), c.cfg.Layers)
	}
	for l, p := range b.Layers {
		if len(p) != c.cfg.PayloadSize {
			return fmt.Errorf("layer %d: %d bytes, want %d", l, len(p), c.cfg.PayloadSize)
		}
		if err := kv.VerifyPayload(p, b.Seq, l, b.Sums[l]); err != nil {
			return err
		}
	}
	return nil
}

// CachedBlock is one registered block of the pool.
type CachedBlock struct {
	Seq       kv.SeqHash
	Local     kv.LocalHash
	HasParent bool
	Parent    kv.SeqHash
	Refs      int
}

// AppendCached appends every registered block to dst (in block-id order).
func (c *Core) AppendCached(dst []CachedBlock) []CachedBlock {
	for i := range c.pool.blocks {
		b := &c.pool.blocks[i]
		if b.flags&flagRegistered == 0 {
			continue
		}
		dst = append(dst, CachedBlock{Seq: b.seq, Local: b.local, HasParent: b.flags&flagHasParent != 0,
			Parent: b.parent, Refs: int(b.ref)})
	}
	return dst
}

// Inventory lists the blocks the pool holds as Stored events on the device
// tier (ID 0, the core's worker key, engine hash = sequence hash): a chain
// per event, parents before children, so that applied in order to an empty
// index they rebuild the holdings its events built. A block whose parent
// was evicted before it (a fetched chain's blocks are freed first to last)
// is listed under that parent, which it no longer holds, as the events left
// it: an index drops it (ParentNotFound), and no query could reach it.
func (c *Core) Inventory() []kv.Event {
	cached := c.AppendCached(nil)
	at := make(map[kv.SeqHash]int, len(cached))
	for i, b := range cached {
		at[b.Seq] = i
	}
	depth := make([]int, len(cached)) // blocks above it in the pool, plus 1
	var path []int
	for i := range cached {
		// Walk up to a block of known depth (or the root, or a missing
		// parent), then set the depths on the way back down.
		path = append(path[:0], i)
		d := 0
		for {
			b := cached[path[len(path)-1]]
			j, ok := at[b.Parent]
			if !b.HasParent || !ok {
				break
			}
			if depth[j] > 0 {
				d = depth[j]
				break
			}
			path = append(path, j)
		}
		for k := len(path) - 1; k >= 0; k-- {
			d++
			depth[path[k]] = d
		}
	}
	order := make([]int, len(cached))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return depth[a] - depth[b] })
	var evs []kv.Event
	open := make(map[kv.SeqHash]int, len(cached)) // last block of an event -> that event
	for _, i := range order {
		b := cached[i]
		blk := kv.StoredBlock{EngineHash: EngineHash(b.Seq), LocalHash: b.Local}
		if e, ok := open[b.Parent]; ok && b.HasParent {
			evs[e].Blocks = append(evs[e].Blocks, blk)
			delete(open, b.Parent)
			open[b.Seq] = e
			continue
		}
		evs = append(evs, kv.Event{Worker: c.cfg.Worker, Tier: kv.TierDevice, Kind: kv.EventStored,
			HasParent: b.HasParent, Parent: EngineHash(b.Parent), Blocks: []kv.StoredBlock{blk}})
		open[b.Seq] = len(evs) - 1
	}
	if c.kb != nil {
		evs = append(evs, c.kb.mgr.Inventory(c.cfg.Worker)...)
	}
	return evs
}

// seqDeque is a ring buffer of requests: FCFS with preempted requests put
// back at the front.
type seqDeque struct {
	buf     []*Seq
	head, n int
}

func (d *seqDeque) len() int { return d.n }

func (d *seqDeque) at(i int) *Seq { return d.buf[(d.head+i)%len(d.buf)] }

func (d *seqDeque) front() *Seq { return d.buf[d.head] }

func (d *seqDeque) grow() {
	if d.n < len(d.buf) {
		return
	}
	nb := make([]*Seq, max(16, 2*len(d.buf)))
	for i := 0; i < d.n; i++ {
		nb[i] = d.at(i)
	}
	d.buf, d.head = nb, 0
}

func (d *seqDeque) pushBack(s *Seq) {
	d.grow()
	d.buf[(d.head+d.n)%len(d.buf)] = s
	d.n++
}

func (d *seqDeque) pushFront(s *Seq) {
	d.grow()
	d.head = (d.head - 1 + len(d.buf)) % len(d.buf)
	d.buf[d.head] = s
	d.n++
}

func (d *seqDeque) popFront() *Seq {
	s := d.buf[d.head]
	d.buf[d.head] = nil
	d.head = (d.head + 1) % len(d.buf)
	d.n--
	return s
}

// remove deletes s, keeping the order of the rest.
func (d *seqDeque) remove(s *Seq) bool {
	for i := 0; i < d.n; i++ {
		if d.at(i) != s {
			continue
		}
		for j := i; j < d.n-1; j++ {
			d.buf[(d.head+j)%len(d.buf)] = d.at(j + 1)
		}
		d.buf[(d.head+d.n-1)%len(d.buf)] = nil
		d.n--
		return true
	}
	return false
}
