// Package index is kvmesh's KV index: which worker holds which KV blocks on
// which tier, fed by KV events and queried by the router.
//
// Layout. One node per distinct path of local hashes (parent-scoped, so
// equal blocks under different prefixes are different nodes). Nodes live in
// fixed-size chunks addressed by uint32 ids, so the GC scans no per-node
// pointers and a chunk never moves. A node's hot part (local hash, parent
// id with a generation, holders) is 24 bytes; its cold part (shared engine
// hash, child count) 10 more.
//
// Chains. A chain stored in one event gets consecutive ids (a freed chain
// is reused the same way), so nearly every child sits at id parent+1: such
// a successor costs no child-table slot and is found by one sequential
// load. Only the other children go into the open-addressing child table
// keyed by (parent id, local hash), whose slots are node ids tagged with
// part of the key's hash.
//
// Holders. Up to two (worker slot, tier mask) entries sit inline in the
// holders word. A node with more holders names an immutable, interned
// holder set (hset.go): nodes with equal holders share one, which is what
// conversation traces produce (a prefix is held by every worker that served
// a later turn), so FindMatches passes every level whose holders word
// equals the level above's without looking at any holder.
//
// Engine hashes resolve through a writer-only table of 32-bit slots (id and
// hash tag, etab.go): a node remembers the first engine hash any worker stored
// it under, and workers that report that same hash (vLLM and the sim do)
// cost nothing more; a worker using another hash for the node gets a
// per-worker exception entry.
//
// Concurrency. Writers serialise on one mutex (events of a worker stay in
// order because Apply is synchronous). Readers take no lock: every field a
// reader touches is read atomically, tables, holder sets and the chunk
// directory are replaced copy-on-write and reclaimed by the GC (RCU), and a
// node carries a generation next to its parent id that changes whenever it
// is freed or reused, so a reader that raced a recycle notices and retries;
// a holders word carries its set's generation the same way. Sharded
// (sharded.go) gives groups of workers an index and a writer each, so
// events of different groups apply in parallel.
//
// It imports only kv and internal helpers: it is a pure core fed by whoever
// holds the events (the fleet's event feed, the twin), and must not import
// the router or any transport.
package index

import (
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/kvmesh/kvmesh/internal/mix"
	"github.com/kvmesh/kvmesh/kv"
)

// Match is one worker's overlap with a query.
type Match struct {
	Worker kv.WorkerKey
	// Depth[t] = number of leading query blocks the worker holds on tier t
	// or a faster tier (cumulative):
	// Depth[TierDevice] ≤ Depth[TierHost] ≤ Depth[TierDisk] ≤ Depth[TierExternal].
	Depth [kv.NumTiers]uint32
}

// Stats counts applied work and every kind of bad input the index absorbed.
type Stats struct {
	Events, Blocks uint64
	// ParentNotFound: a Stored whose parent engine hash the worker does not
	// hold on any tier; the whole event is dropped (as Dynamo does).
	ParentNotFound uint64
	// DuplicateStore: a block stored on a tier where the worker already
	// holds it under the same engine hash; a no-op.
	DuplicateStore uint64
	// RemoveUnknown: a removed engine hash the worker does not hold on that
	// tier (or an unknown worker); ignored.
	RemoveUnknown uint64
	// Rebound: a store that broke the one-to-one mapping between a worker's
	// engine hashes and nodes: the engine hash named another node (that
	// holding is dropped) or the node had another engine hash (re-keyed).
	Rebound uint64
	// BadTier, BadKind: events with an unknown tier or kind; dropped.
	BadTier, BadKind uint64
	// UnknownWorkerCleared: Cleared for a worker the index never saw.
	UnknownWorkerCleared uint64
	// TooManyWorkers: a Stored for a new worker beyond 2^27 slots; dropped.
	TooManyWorkers uint64
	// Nodes is the number of live nodes; Holdings the (worker, block) pairs;
	// Overflow the nodes with more than two holders; HolderSets the
	// distinct holder sets those nodes share.
	Nodes, Holdings, Overflow, HolderSets uint64
	// ReadRetries counts lookups restarted because a node was recycled
	// under them.
	ReadRetries uint64
}

const (
	chunkBits = 12
	chunkSize = 1 << chunkBits
	chunkMask = chunkSize - 1

	noParent  = 0xFFFFFFFF // parent id of a freed node
	tomb      = 0xFFFFFFFF // deleted table slot
	ovfFlag   = 1 << 63
	hasEngBit = 1 << 15
	ncCount   = hasEngBit - 1 // a node's child count, or ncBig
	ncBig     = ncCount       // the count is in Index.bigKids
	maxSlots  = 1 << 27
)

// hot is what readers touch; every access is atomic.
type hot struct {
	local   atomic.Uint64
	pg      atomic.Uint64 // mkPG(generation, parent id); zero memory is a free node
	holders atomic.Uint64 // two inline entries (slot<<4|mask) or ovfWord(set index, generation)
}

type chunk struct {
	hot [chunkSize]hot
	eng [chunkSize]uint64 // writer only
	nc  [chunkSize]uint16 // writer only: children (see ncBig) | hasEngBit
}

// table is an open-addressing table of node ids with linear probing. A
// slot holds the id in its low 32 bits, a run hint in the next 16 and the
// top 16 bits of the key's hash (a tag) above, so a probe passing other
// keys compares tags instead of loading their nodes (each a random cache
// miss), and a miss costs no node at all. The run hint counts the nodes
// of this node's run of consecutive ids (successors) up to where the last
// chain stored below it leaves it (the run's end at first): FindMatches
// follows hints from slot to slot to find and prefetch every turn of a
// query before it walks them (warmPath). It is only a hint (chains grow
// and shrink later). It is kept at most half full: chain heads are few
// (~12k for the 1.4M nodes of the Mooncake replay), so slots are cheap
// and short probe runs are not.
type table struct {
	slots      []atomic.Uint64
	mask       uint64
	used, dead int
}

func newTable(n int) *table {
	size := 1024
	for size < n*2 {
		size <<= 1
	}
	return &table{slots: make([]atomic.Uint64, size), mask: uint64(size - 1)}
}

// tslot is the table entry of node id under key hash hash, run hint run.
func tslot(hash uint64, id uint32, run uint16) uint64 {
	return hash&^(1<<tagShift-1) | uint64(run)<<32 | uint64(id)
}

const tagShift = 48 // a slot's tag is the key hash's bits from here up

// runOf is a slot's run hint.
func runOf(e uint64) uint32 { return uint32(e>>32) & 0xFFFF }

type wstate struct {
	key    kv.WorkerKey
	slot   uint32
	counts [kv.NumTiers]int64
	exc    map[uint64]uint32 // engine hash -> node, where not the node's shared hash
	over   map[uint32]uint64 // node -> engine hash, the inverse of exc
}

// view is the readers' copy of the worker table.
type view struct {
	keys   []kv.WorkerKey // by slot; may share its array with later views (see publishView)
	slotOf []uint32       // by rank (ascending WorkerKey)
	words  int            // 64-slot words covering every slot
	live   []uint64       // bitset of the slots in slotOf
}

// Index is the event-driven KV index. The zero value is not usable; call New.
type Index struct {
	mu sync.Mutex // writers

	dir    atomic.Pointer[[]*chunk]
	ovfDir atomic.Pointer[[]*ovfChunk]
	ctab   atomic.Pointer[table] // (parent, local) -> node
	etab   engTable              // shared engine hash -> node (writer only)
	egrow  *etabGrow             // the next engine table while it is built across inserts (etab.go)
	vw     atomic.Pointer[view]

	next, ovfNext uint32
	free          []uint32 // freed node ids; may hold stale or repeated ids (see alloc)
	freeSeen      []uint64 // pushFree's scratch bitset over ids, all zero between uses
	nfree         int      // free ids below next
	ovfFree       []uint32
	ovfGen        uint32
	sets          map[uint64]uint32 // content hash -> interned holder set
	memo          transition
	entBuf        []uint32
	workers       map[kv.WorkerKey]*wstate
	slots         []*wstate
	keys          []kv.WorkerKey // by slot: the views' keys, appended to in place
	freeSlots     []uint32
	order         []uint32          // the live slots by ascending worker key (the next view's slotOf)
	cand          []uint32          // nodes that may have become empty during an event
	bigKids       map[uint32]uint32 // child counts of nodes past ncBig-1 children
	found         []uint32          // prefind's answers, by position in the event
	fresh         []uint32          // storeFresh's new nodes, by position in its run
	freshHash     []uint64          // their engine hashes' table hashes (prefind's too)
	touchedTag    uint32            // keeps storeFresh's warming loads
	touched       uint64            // keeps prefind's warming loads
	st            Stats
	seed          uint64
	retries       atomic.Uint64
	// rootRun is the run hint of node 1's run: the root's successor has
	// no child-table slot to carry one, and in a trace whose prompts share
	// a system prompt every query starts in that run.
	rootRun atomic.Uint32
	scratch sync.Pool
	cfg     Config
	// onView, when set (by Sharded), is told of every view published,
	// under the writer lock.
	onView func(v *view)
	// joined: the event being applied added worker slot joinSlot, which
	// endEvent publishes.
	joined   bool
	joinSlot uint32
}

// Config tunes an index. The zero value gives the defaults.
type Config struct {
	// BindAfterSlots is the engine-table size (slots of 4 bytes) from
	// which a new chain is created first and its engine hashes bound
	// after, rather than node by node: past the cache each binding is a
	// miss that newNode's atomic store would wait for. 0: 64k slots; a
	// negative value binds after at every size (tests use it to cover
	// that path on small indexes).
	BindAfterSlots int
}

// defaultBindAfterSlots is where a 4-byte-slot engine table outgrows a
// typical L2.
const defaultBindAfterSlots = 1 << 16

func (c Config) bindAfter() int {
	switch {
	case c.BindAfterSlots < 0:
		return 0
	case c.BindAfterSlots == 0:
		return defaultBindAfterSlots
	}
	return c.BindAfterSlots
}

// New returns an empty index with the default Config.
func New() *Index { return NewWith(Config{}) }

// NewWith returns an empty index tuned by cfg.
func NewWith(cfg Config) *Index {
	ix := &Index{workers: map[kv.WorkerKey]*wstate{}, next: 1, ovfNext: 1, sets: map[uint64]uint32{}, seed: 0x2545F4914F6CDD1D, cfg: cfg}
	d := []*chunk{newChunk()} // id 0 is the root
	ix.dir.Store(&d)
	od := []*ovfChunk{new(ovfChunk)}
	ix.ovfDir.Store(&od)
	ix.ctab.Store(newTable(0))
	ix.etab = newEngTable(0, 0)
	ix.vw.Store(&view{})
	ix.scratch.New = func() any { return new(scratch) }
	return ix
}

// newChunk returns a chunk of free nodes (zero memory reads as noParent,
// so a successor probe never matches a node not created yet, and a new
// chunk costs no initialising stores).
func newChunk() *chunk { return new(chunk) }

// The parent id is stored complemented so that zero means noParent.
func mkPG(gen uint64, parent uint32) uint64 { return gen<<32 | uint64(^parent) }

func parentOf(pg uint64) uint32 { return ^uint32(pg) }

func nodeAt(dir []*chunk, id uint32) *hot { return &dir[id>>chunkBits].hot[id&chunkMask] }

func (ix *Index) chunkOf(id uint32) *chunk { return (*ix.dir.Load())[id>>chunkBits] }

func (ix *Index) childHash(parent uint32, local uint64) uint64 {
	return mix.Mix64(local ^ ix.seed ^ uint64(parent)*mix.Golden)
}

// lookup finds the child of parent with the given local hash. It returns
// the node id, its pg word as validated and its holders word; id 0 if absent.
// run is the slot's run hint when the child came from the table, else 0.
func (ix *Index) lookup(t *table, dir []*chunk, parent uint32, local uint64) (id uint32, pg, holders uint64, d []*chunk, run uint32, ok bool) {
	// The successor first: it is the child in almost every chain.
	if s := parent + 1; int(s>>chunkBits) < len(dir) {
		n := nodeAt(dir, s)
		pg = n.pg.Load()
		if parentOf(pg) == parent && n.local.Load() == local {
			holders = n.holders.Load()
			if n.pg.Load() != pg {
				return 0, 0, 0, dir, 0, false
			}
			return s, pg, holders, dir, 0, true
		}
	}
	hash := ix.childHash(parent, local)
	i := hash & t.mask
	for {
		e := t.slots[i].Load()
		id = uint32(e)
		if id == 0 {
			return 0, 0, 0, dir, 0, true
		}
		if id != tomb && (e^hash)>>tagShift == 0 {
			if int(id>>chunkBits) >= len(dir) {
				dir = *ix.dir.Load()
				if int(id>>chunkBits) >= len(dir) {
					return 0, 0, 0, dir, 0, false
				}
			}
			n := nodeAt(dir, id)
			pg = n.pg.Load()
			if parentOf(pg) == parent && n.local.Load() == local {
				holders = n.holders.Load()
				if n.pg.Load() != pg {
					return 0, 0, 0, dir, 0, false
				}
				return id, pg, holders, dir, runOf(e), true
			}
		}
		i = (i + 1) & t.mask
	}
}

// findChild is the writer's lookup (no concurrent mutation possible).
func (ix *Index) findChild(parent uint32, local uint64) uint32 {
	id, _, _, _, _, _ := ix.lookup(ix.ctab.Load(), *ix.dir.Load(), parent, local)
	return id
}

func (ix *Index) tableInsert(tp *atomic.Pointer[table], t *table, hash uint64, id uint32, rehash func(uint32) uint64) *table {
	if (t.used+t.dead+1)*2 > len(t.slots) {
		// At most a quarter full after the rebuild: under insert/delete
		// churn the next one is then a quarter of the table's inserts
		// away, where sizing for half full could rebuild every few
		// thousand inserts, each rehash reading every live node (a
		// random miss apiece).
		nt := newTable(2 * (t.used + 1))
		for i := range t.slots {
			if x := t.slots[i].Load(); uint32(x) != 0 && uint32(x) != tomb {
				j := rehash(uint32(x)) & nt.mask
				for nt.slots[j].Load() != 0 {
					j = (j + 1) & nt.mask
				}
				nt.slots[j].Store(x)
				nt.used++
			}
		}
		t = nt
		if tp != nil {
			tp.Store(t)
		}
	}
	for i := hash & t.mask; ; i = (i + 1) & t.mask {
		x := uint32(t.slots[i].Load())
		if x == 0 || x == tomb {
			if x == tomb {
				t.dead--
			}
			t.slots[i].Store(tslot(hash, id, 0))
			t.used++
			return t
		}
	}
}

// maxRunWalk bounds runHead's walk (a turn is rarely longer).
const maxRunWalk = 4096

// runHead walks back from node p over successor links to the first node
// of its run and returns it with its parent (1 and 0 for the root's
// successor's run); 0 when the run is longer than maxRunWalk.
func (ix *Index) runHead(p uint32) (uint32, uint32) {
	dir := *ix.dir.Load()
	for k := 0; k < maxRunWalk && p != 0; k++ {
		par := parentOf(nodeAt(dir, p).pg.Load())
		if par != p-1 || par == 0 {
			return p, par // par == 0: p is 1, the root's successor
		}
		p = par
	}
	return 0, 0
}

// setRun sets the run hint of node id's slot (readers see the old or the
// new word: both name id under the same tag).
func setRun(t *table, hash uint64, id uint32, run int) {
	for i := hash & t.mask; ; i = (i + 1) & t.mask {
		x := t.slots[i].Load()
		if uint32(x) == 0 {
			return
		}
		if uint32(x) == id {
			t.slots[i].Store(tslot(hash, id, uint16(min(run, 0xFFFF))))
			return
		}
	}
}

func tableDelete(t *table, hash uint64, id uint32) {
	for i := hash & t.mask; ; i = (i + 1) & t.mask {
		x := uint32(t.slots[i].Load())
		if x == 0 {
			return
		}
		if x == id {
			t.slots[i].Store(tomb)
			t.used--
			t.dead++
			return
		}
	}
}

// inTable reports whether node id (child of parent) has a child-table slot:
// a parent's successor has none.
func inTable(id, parent uint32) bool { return id != parent+1 }

func (ix *Index) rehashChild(id uint32) uint64 {
	n := nodeAt(*ix.dir.Load(), id)
	return ix.childHash(parentOf(n.pg.Load()), n.local.Load())
}

func (ix *Index) isFree(id uint32) bool {
	return parentOf(nodeAt(*ix.dir.Load(), id).pg.Load()) == noParent
}

// alloc picks the id of a new child of parent: parent's successor when it
// is free, else a freed id, else a fresh one. The free stack is lazy: an id
// taken as a successor stays in it (stale) and is skipped when popped; it
// is compacted when stale entries dominate.
func (ix *Index) alloc(parent uint32) uint32 {
	s := parent + 1
	if s < ix.next && ix.isFree(s) {
		ix.nfree--
		return s
	}
	if s != ix.next {
		for k := len(ix.free); k > 0; k = len(ix.free) {
			id := ix.free[k-1]
			ix.free = ix.free[:k-1]
			if ix.isFree(id) {
				ix.nfree--
				return id
			}
		}
	}
	id := ix.next
	ix.next++
	d := *ix.dir.Load()
	if int(id>>chunkBits) >= len(d) {
		nd := append(append(make([]*chunk, 0, len(d)+1), d...), newChunk())
		ix.dir.Store(&nd)
	}
	return id
}

// pushFree records a freed id, compacting the stack when it is mostly
// stale or repeated entries.
func (ix *Index) pushFree(id uint32) {
	ix.nfree++
	ix.free = append(ix.free, id)
	if len(ix.free) < 2*ix.nfree+1024 {
		return
	}
	// Marks in a bitset over ids, not a Go map: the compaction runs
	// often under eviction churn.
	if w := int(ix.next+63) / 64; len(ix.freeSeen) < w {
		ix.freeSeen = make([]uint64, w)
	}
	seen := ix.freeSeen
	live := ix.free[:0]
	for _, x := range ix.free {
		if seen[x/64]&(1<<(x%64)) == 0 && ix.isFree(x) {
			seen[x/64] |= 1 << (x % 64)
			live = append(live, x)
		}
	}
	for _, x := range live {
		seen[x/64] = 0
	}
	ix.free = live
}

// newNode creates the child (parent, local) with holders word holders.
// Readers may probe it as soon as pg names the parent, so pg goes last.
// (Atomic stores are full barriers on amd64: each one counts.)
func (ix *Index) newNode(parent uint32, local, holders uint64) uint32 {
	id := ix.alloc(parent)
	c := ix.chunkOf(id)
	n := &c.hot[id&chunkMask]
	pg0 := n.pg.Load()
	if pg0 == 0 {
		// Never used (a used node keeps a generation): readers look at
		// local and holders only after loading a pg that names their
		// parent, i.e. after the pg store below, which orders these plain
		// stores before them. Atomic stores are full barriers on amd64,
		// and a fresh chain is mostly stores.
		*(*uint64)(unsafe.Pointer(&n.local)) = local
		*(*uint64)(unsafe.Pointer(&n.holders)) = holders
	} else {
		n.local.Store(local)
		n.holders.Store(holders)
	}
	n.pg.Store(mkPG(pg0>>32+1, parent))
	c.eng[id&chunkMask] = 0
	c.nc[id&chunkMask] = 0
	if parent != 0 {
		ix.addChild(parent)
	}
	if inTable(id, parent) {
		ix.tableInsert(&ix.ctab, ix.ctab.Load(), ix.childHash(parent, local), id, ix.rehashChild)
	}
	ix.st.Nodes++
	return id
}

// newRun creates a chain of new nodes below parent, one per block, at the
// ids from next on (never used: their memory is zero, as newNode finds a
// fresh id's), and appends their ids to ids. It is newNode's work for the
// whole chain at once: the directory grown once, no free-list or
// successor checks per node, each node but the last counted as its
// successor's parent directly. The caller checked that no freed id is
// waiting to be reused (alloc would take it first).
func (ix *Index) newRun(ids []uint32, parent uint32, blocks []kv.StoredBlock, holders uint64) []uint32 {
	first := ix.next
	ix.next += uint32(len(blocks))
	d := *ix.dir.Load()
	if need := int((ix.next-1)>>chunkBits) + 1; need > len(d) {
		nd := append(make([]*chunk, 0, need), d...)
		for len(nd) < need {
			nd = append(nd, newChunk())
		}
		ix.dir.Store(&nd)
		d = nd
	}
	if parent != 0 {
		ix.addChild(parent)
	}
	p := parent
	for j, b := range blocks {
		id := first + uint32(j)
		c := d[id>>chunkBits]
		k := id & chunkMask
		n := &c.hot[k]
		// Plain stores before the pg store, as in newNode's fresh case.
		*(*uint64)(unsafe.Pointer(&n.local)) = uint64(b.LocalHash)
		*(*uint64)(unsafe.Pointer(&n.holders)) = holders
		n.pg.Store(mkPG(1, p))
		if j+1 < len(blocks) {
			c.nc[k] = 1 // the next node of the run
		}
		ids = append(ids, id)
		p = id
	}
	if inTable(first, parent) {
		ix.tableInsert(&ix.ctab, ix.ctab.Load(), ix.childHash(parent, uint64(blocks[0].LocalHash)), first, ix.rehashChild)
	}
	ix.st.Nodes += uint64(len(blocks))
	return ids
}

// addChild counts a new child of id. A count takes 15 bits of the node
// (two bytes a node, where every node paying 4 cost more than the engine
// table); the few nodes with more children (a shared system prompt's last
// block under a large fleet) keep theirs in bigKids.
func (ix *Index) addChild(id uint32) {
	nc := &ix.chunkOf(id).nc[id&chunkMask]
	switch n := *nc & ncCount; {
	case n < ncBig-1:
		*nc++
	case n == ncBig-1:
		*nc |= ncBig
		if ix.bigKids == nil {
			ix.bigKids = map[uint32]uint32{}
		}
		ix.bigKids[id] = ncBig
	default:
		ix.bigKids[id]++
	}
}

// subChild counts a child of id gone.
func (ix *Index) subChild(id uint32) {
	nc := &ix.chunkOf(id).nc[id&chunkMask]
	if *nc&ncCount != ncBig {
		*nc--
		return
	}
	if n := ix.bigKids[id] - 1; n < ncBig {
		*nc = *nc&^ncCount | uint16(n)
		delete(ix.bigKids, id)
	} else {
		ix.bigKids[id] = n
	}
}

// childCount is id's number of children.
func (ix *Index) childCount(id uint32) int {
	if n := ix.chunkOf(id).nc[id&chunkMask] & ncCount; n != ncBig {
		return int(n)
	}
	return int(ix.bigKids[id])
}

// freeNode releases an empty, childless node and walks up to its parent.
func (ix *Index) maybeFree(id uint32) {
	for id != 0 {
		c := ix.chunkOf(id)
		n := &c.hot[id&chunkMask]
		pg := n.pg.Load()
		if parentOf(pg) == noParent || n.holders.Load() != 0 && ix.holderCount(n.holders.Load()) != 0 || c.nc[id&chunkMask]&ncCount != 0 {
			return
		}
		parent := parentOf(pg)
		if inTable(id, parent) {
			tableDelete(ix.ctab.Load(), ix.childHash(parent, n.local.Load()), id)
		}
		if c.nc[id&chunkMask]&hasEngBit != 0 {
			ix.etabDelete(c.eng[id&chunkMask], id)
		}
		n.pg.Store(mkPG(pg>>32+1, noParent))
		if h := n.holders.Load(); h&ovfFlag != 0 {
			ix.release(h)
			ix.st.Overflow--
		}
		n.holders.Store(0)
		c.nc[id&chunkMask] = 0
		ix.pushFree(id)
		ix.st.Nodes--
		if parent == 0 {
			return
		}
		ix.subChild(parent)
		id = parent
	}
}

func (ix *Index) holderCount(h uint64) int {
	if h&ovfFlag != 0 {
		return len(ix.setOf(h).ent)
	}
	n := 0
	if uint32(h) != 0 {
		n++
	}
	if uint32(h>>32) != 0 {
		n++
	}
	return n
}

// maskOf returns the tier mask slot holds id on.
// (Writers only: it reads the last transition, which a chain's blocks
// usually share, before searching a set.)
func (ix *Index) maskOf(id, slot uint32) uint8 {
	h := nodeAt(*ix.dir.Load(), id).holders.Load()
	if t := &ix.memo; h == t.from && slot == t.slot && h&ovfFlag != 0 {
		return t.had
	}
	return maskIn(ix, h, slot)
}

func maskIn(ix *Index, h uint64, slot uint32) uint8 {
	if h&ovfFlag != 0 {
		if hs := ix.setOf(h); hs != nil {
			return hs.mask(slot)
		}
		return 0
	}
	for _, e := range [2]uint32{uint32(h), uint32(h >> 32)} {
		if e != 0 && e>>4 == slot {
			return uint8(e & 15)
		}
	}
	return 0
}

// setMask sets slot's tier mask on id (0 removes the holder).
func (ix *Index) setMask(id, slot uint32, m uint8) {
	n := nodeAt(*ix.dir.Load(), id)
	h := n.holders.Load()
	nh := ix.withMask(h, slot, m)
	n.holders.Store(nh)
	if h&ovfFlag != 0 {
		ix.release(h)
		if nh&ovfFlag == 0 {
			ix.st.Overflow--
		}
	} else if nh&ovfFlag != 0 {
		ix.st.Overflow++
	}
}

func (ix *Index) worker(w kv.WorkerKey, create bool) *wstate {
	if ws := ix.workers[w]; ws != nil || !create {
		return ws
	}
	ws := &wstate{key: w}
	if k := len(ix.freeSlots); k > 0 {
		ws.slot = ix.freeSlots[k-1]
		ix.freeSlots = ix.freeSlots[:k-1]
		ix.slots[ws.slot] = ws
	} else {
		if len(ix.slots) >= maxSlots {
			return nil
		}
		ws.slot = uint32(len(ix.slots))
		ix.slots = append(ix.slots, ws)
	}
	ix.workers[w] = ws
	ix.order = slices.Insert(ix.order, ix.rankIn(w), ws.slot)
	// Readers see the new worker when its first event is applied
	// (endEvent), not before: a find then never meets it live but
	// holding none of the blocks that event stores, which would keep a
	// Sharded answer from being written into place.
	ix.joined, ix.joinSlot = true, ws.slot
	return ws
}

// rankIn is where worker key w sits (or would) in ix.order.
func (ix *Index) rankIn(w kv.WorkerKey) int {
	return sort.Search(len(ix.order), func(i int) bool { return !less(ix.slots[ix.order[i]].key, w) })
}

// publishView gives readers a fresh view of the worker table after slot
// joined (on) or left it. ix.order is kept sorted as workers come and go,
// so a view costs a copy of it and of the live bitset, no sort and no pass
// over the workers: at thousands of workers first a sort per new worker,
// then rebuilding every per-slot array dominated the whole replay. Keys
// are appended in place: an older view's slice ends before a new slot, so
// its reader never sees it change; a reused slot gets a fresh copy.
func (ix *Index) publishView(slot uint32, on bool) {
	old := ix.vw.Load()
	if on {
		key := ix.slots[slot].key
		if int(slot) < len(ix.keys) {
			ix.keys = slices.Clone(ix.keys)
			ix.keys[slot] = key
		} else {
			ix.keys = append(ix.keys, key)
		}
	}
	n := len(ix.keys)
	v := &view{keys: ix.keys[:n:n], words: (n + 63) / 64, slotOf: slices.Clone(ix.order)}
	v.live = make([]uint64, v.words)
	copy(v.live, old.live)
	if on {
		v.live[slot>>6] |= 1 << (slot & 63)
	} else {
		v.live[slot>>6] &^= 1 << (slot & 63)
	}
	ix.vw.Store(v)
	if ix.onView != nil {
		ix.onView(v)
	}
}

func less(a, b kv.WorkerKey) bool {
	if a.Instance != b.Instance {
		return a.Instance < b.Instance
	}
	return a.DPRank < b.DPRank
}

// engineOf is the engine hash ws uses for node id (which it holds).
func (ix *Index) engineOf(ws *wstate, id uint32) uint64 {
	if e, ok := ws.over[id]; ok {
		return e
	}
	return ix.chunkOf(id).eng[id&chunkMask]
}

// resolve finds the node ws holds under engine hash h, or 0.
func (ix *Index) resolve(ws *wstate, h uint64) uint32 {
	if id, ok := ws.exc[h]; ok {
		return id
	}
	id, _ := ix.etabFind(h)
	return ix.heldShared(ws, id)
}

// heldShared returns id if ws holds it under its shared engine hash, else 0.
func (ix *Index) heldShared(ws *wstate, id uint32) uint32 {
	if id == 0 || ix.maskOf(id, ws.slot) == 0 {
		return 0
	}
	if _, ok := ws.over[id]; ok {
		return 0
	}
	return id
}

func (ix *Index) unbind(ws *wstate, id uint32) {
	if e, ok := ws.over[id]; ok {
		delete(ws.exc, e)
		delete(ws.over, id)
	}
}

// drop removes every tier of ws's holding of id.
func (ix *Index) drop(ws *wstate, id uint32) {
	m := ix.maskOf(id, ws.slot)
	for t := 0; t < kv.NumTiers; t++ {
		if m&(1<<t) != 0 {
			ws.counts[t]--
		}
	}
	if m != 0 {
		ix.st.Holdings--
	}
	ix.setMask(id, ws.slot, 0)
	ix.unbind(ws, id)
	ix.cand = append(ix.cand, id)
}

// bind makes h the engine hash ws uses for node id.
func (ix *Index) bind(ws *wstate, id uint32, h uint64) {
	if ix.maskOf(id, ws.slot) != 0 {
		if ix.engineOf(ws, id) == h {
			return
		}
		ix.st.Rebound++
		ix.unbind(ws, id)
	}
	c := ix.chunkOf(id)
	k := id & chunkMask
	if c.nc[k]&hasEngBit != 0 && c.eng[k] == h {
		// The usual case: every worker names the node alike. Then only an
		// exception entry of ws can name another node under h.
		if other, ok := ws.exc[h]; ok && other != id {
			ix.st.Rebound++
			ix.drop(ws, other)
		}
		return
	}
	if other := ix.resolve(ws, h); other != 0 && other != id {
		ix.st.Rebound++
		ix.drop(ws, other)
	}
	if c.nc[k]&hasEngBit == 0 {
		if x, ins := ix.etabFind(h); x == 0 {
			c.eng[k] = h
			c.nc[k] |= hasEngBit
			ix.etabInsert(h, id, ins)
		}
	}
	if c.nc[k]&hasEngBit != 0 && c.eng[k] == h {
		return
	}
	if ws.exc == nil {
		ws.exc, ws.over = map[uint64]uint32{}, map[uint32]uint64{}
	}
	ws.exc[h] = id
	ws.over[id] = h
}

// storeFresh creates the chain of children blocks below p, none of which
// exists, and stores them for ws on tier: the general path without the
// lookups whose answer is known for a new node (no child, no holder, no
// binding). It returns the last node.
//
// Nodes first, engine hashes after: newNode's atomic pg store drains the
// store buffer on amd64, so an engine-table store (a random cache miss)
// left before it made every new node wait for DRAM. Binding after the
// chain exists gives the same result (a binding's drop touches no node
// the chain creation reads), and the table probes, warmed first, overlap.
func (ix *Index) storeFresh(ws *wstate, p uint32, blocks []kv.StoredBlock, tier kv.Tier) uint32 {
	// Not free candidates: they end the event held unless a later block
	// drops them, and drop makes them one.
	ids := ix.fresh[:0]
	p0 := p
	hw := uint64(ws.slot<<4 | 1<<tier)
	small := len(ix.etab.slots) < ix.cfg.bindAfter()
	if ix.nfree == 0 {
		// No freed id to reuse: the chain takes the next ids in one run.
		ids = ix.newRun(ids, p, blocks, hw)
		p = ids[len(ids)-1]
		if small {
			for j, b := range blocks {
				ix.bindFresh(ws, ids[j], uint64(b.EngineHash), ix.engHash(uint64(b.EngineHash)))
			}
		}
	} else {
		for _, b := range blocks {
			p = ix.newNode(p, uint64(b.LocalHash), hw)
			ids = append(ids, p)
			if small {
				// A table this small stays in cache: its stores cost newNode
				// no wait, and binding here saves the passes below.
				ix.bindFresh(ws, p, uint64(b.EngineHash), ix.engHash(uint64(b.EngineHash)))
			}
		}
	}
	ix.fresh = ids
	// Run hints for the chain's table entries, from the end backwards.
	run := 0
	for j := len(ids) - 1; j >= 0; j-- {
		run++
		par := p0
		if j > 0 {
			par = ids[j-1]
		}
		if inTable(ids[j], par) {
			setRun(ix.ctab.Load(), ix.childHash(par, uint64(blocks[j].LocalHash)), ids[j], run)
			run = 0
		}
	}
	// The run the chain leaves (or extends) now ends where the chain
	// starts: its head's hint points there, where a query of the next
	// turn will look up its next node.
	if p0 != 0 {
		if h, par := ix.runHead(p0); h == 1 && par == 0 {
			ix.rootRun.Store(uint32(min(int(p0)+run, 0xFFFF)))
		} else if h != 0 {
			setRun(ix.ctab.Load(), ix.childHash(par, nodeAt(*ix.dir.Load(), h).local.Load()), h, int(p0-h+1)+run)
		}
	}
	// The table hashes are computed once: for the warming loads here and
	// for the probe and insert in bindFresh.
	if !small {
		ix.bindAll(ws, ids, blocks)
	}
	ix.st.Blocks += uint64(len(blocks))
	ix.st.Holdings += uint64(len(blocks))
	ws.counts[tier] += int64(len(blocks))
	return p
}

// bindAll binds the engine hashes of blocks to ids, the nodes just
// created for them, with each probe's slot prefetched bindAhead blocks
// before it is bound: the misses overlap each other and the binding of
// the blocks before them, where loads warming every slot first held the
// core until the last of them arrived.
func (ix *Index) bindAll(ws *wstate, ids []uint32, blocks []kv.StoredBlock) {
	hs := ix.freshHash[:0]
	for _, b := range blocks {
		hs = append(hs, ix.engHash(uint64(b.EngineHash)))
	}
	ix.freshHash = hs
	for j := range min(bindAhead, len(hs)) {
		ix.etabPrefetch(hs[j])
	}
	dir := *ix.dir.Load() // binding allocates no node
	for j, b := range blocks {
		if k := j + bindAhead; k < len(hs) {
			ix.etabPrefetch(hs[k]) // a rebuild on the way only wastes it
		}
		h, id := uint64(b.EngineHash), ids[j]
		x, ins := ix.etabFindHashed(h, hs[j])
		if x != 0 || len(ws.exc) > 0 {
			ix.bindFound(ws, id, h, hs[j], x, ins)
			continue
		}
		// The usual case, bindFound's without its checks: h is new and
		// ws has no exception entry that could name it.
		c := dir[id>>chunkBits]
		c.eng[id&chunkMask] = h
		c.nc[id&chunkMask] |= hasEngBit
		ix.etabInsertHashed(h, hs[j], id, ins)
	}
}

// bindAhead is how many blocks ahead bindAll prefetches.
const bindAhead = 16

// bindFresh binds engine hash h (table hash hash) to c, a node ws just
// stored.
func (ix *Index) bindFresh(ws *wstate, c uint32, h, hash uint64) {
	x, ins := ix.etabFindHashed(h, hash) // one probe serves resolve and insert
	ix.bindFound(ws, c, h, hash, x, ins)
}

// bindFound is bindFresh after its probe: x and ins are etabFindHashed's
// answer for h.
func (ix *Index) bindFound(ws *wstate, c uint32, h, hash uint64, x uint32, ins int) {
	var other uint32
	ok := false
	if len(ws.exc) > 0 {
		other, ok = ws.exc[h]
	}
	if !ok {
		other = ix.heldShared(ws, x)
	}
	if other != 0 {
		ix.st.Rebound++
		ix.drop(ws, other) // frees nothing before the event ends: ins stays valid
	}
	k := c & chunkMask
	ch := ix.chunkOf(c)
	if x == 0 {
		ch.eng[k] = h
		ch.nc[k] |= hasEngBit
		ix.etabInsertHashed(h, hash, c, ins)
	} else {
		if ws.exc == nil {
			ws.exc, ws.over = map[uint64]uint32{}, map[uint32]uint64{}
		}
		ws.exc[h] = c
		ws.over[c] = h
	}
}

// Apply applies one KV event. Bad input is counted in Stats, never fatal.
func (ix *Index) Apply(ev kv.Event) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.apply(&ev)
	ix.endEvent()
}

// endEvent frees the nodes the event may have emptied and publishes the
// worker it added, if any.
func (ix *Index) endEvent() {
	for _, id := range ix.cand {
		ix.maybeFree(id)
	}
	ix.cand = ix.cand[:0]
	if ix.egrow != nil && ix.egrow.owed > 0 {
		ix.etabGrowStep()
	}
	if ix.joined {
		ix.joined = false
		ix.publishView(ix.joinSlot, true)
	}
}

// ApplyBatch applies events in order, exactly as Apply does one at a time,
// under one lock and without copying them: a sink taking an engine's
// flushes whole (the twin's) pays the lock per flush, not per event.
func (ix *Index) ApplyBatch(events []kv.Event) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for i := range events {
		ix.apply(&events[i])
		ix.endEvent()
	}
}

func (ix *Index) apply(ev *kv.Event) {
	ix.st.Events++
	switch ev.Kind {
	case kv.EventStored:
		if !ev.Tier.Valid() {
			ix.st.BadTier++
			return
		}
		ws := ix.worker(ev.Worker, true)
		if ws == nil {
			ix.st.TooManyWorkers++
			return
		}
		p := uint32(0)
		if ev.HasParent {
			if p = ix.resolve(ws, uint64(ev.Parent)); p == 0 {
				ix.st.ParentNotFound++
				return
			}
		}
		bit := uint8(1) << ev.Tier
		for k, b := range ev.Blocks {
			c := ix.findChild(p, uint64(b.LocalHash))
			if c == 0 {
				// The rest of the event is new: its nodes have no children yet.
				ix.storeFresh(ws, p, ev.Blocks[k:], ev.Tier)
				break
			}
			ix.st.Blocks++
			ix.bind(ws, c, uint64(b.EngineHash))
			m := ix.maskOf(c, ws.slot)
			if m&bit != 0 {
				ix.st.DuplicateStore++
			} else {
				if m == 0 {
					ix.st.Holdings++
				}
				ws.counts[ev.Tier]++
				ix.setMask(c, ws.slot, m|bit)
			}
			p = c
		}
	case kv.EventRemoved:
		if !ev.Tier.Valid() {
			ix.st.BadTier++
			return
		}
		ws := ix.worker(ev.Worker, false)
		bit := uint8(1) << ev.Tier
		removed := kv.RawHashes(ev.Removed) // the tables key by raw uint64
		if ws != nil {
			ix.prefind(removed)
		}
		for k, h := range removed {
			ix.st.Blocks++
			var id uint32
			if ws != nil {
				var ok bool
				if id, ok = ws.exc[h]; !ok {
					id = ix.heldShared(ws, ix.found[k])
				}
			}
			m := uint8(0)
			if id != 0 {
				m = ix.maskOf(id, ws.slot)
			}
			if m&bit == 0 {
				ix.st.RemoveUnknown++
				continue
			}
			if m == bit {
				ix.drop(ws, id)
			} else {
				ws.counts[ev.Tier]--
				ix.setMask(id, ws.slot, m&^bit)
			}
		}
	case kv.EventCleared:
		ws := ix.worker(ev.Worker, false)
		if ws == nil {
			ix.st.UnknownWorkerCleared++
			return
		}
		ix.clear(ws)
	default:
		ix.st.BadKind++
	}
}

// prefind resolves every hash of a Removed event through the engine table
// into ix.found before any is applied. The lookups do not depend on each
// other, so their cache misses (table slot, node) overlap instead of
// queueing one removal at a time; and nothing the removals change before
// the event ends (holders, exception entries) affects the table, which
// only shrinks when emptied nodes are freed after the event.
func (ix *Index) prefind(hs []uint64) {
	ix.found = ix.found[:0]
	dir := *ix.dir.Load()
	t := &ix.etab
	// First every probe's first slot (tag and id in one word), so that each lookup
	// then waits only for its node.
	hashes := ix.freshHash[:0]
	var touch uint64
	for _, h := range hs {
		hash := ix.engHash(h)
		hashes = append(hashes, hash)
		touch += uint64(t.slots[hash&t.mask])
	}
	ix.freshHash = hashes
	for k, h := range hs {
		id, _ := ix.etabFindHashed(h, hashes[k])
		ix.found = append(ix.found, id)
		touch += nodeAt(dir, id).holders.Load() // warm what heldShared reads
	}
	ix.touched = touch
}

// clear drops all of ws's holdings: a scan over all nodes (clears and
// worker removals are rare; per-worker lists would cost memory per holding).
func (ix *Index) clear(ws *wstate) {
	if ws.counts == ([kv.NumTiers]int64{}) {
		return
	}
	ix.forEachHeld(ws.slot, func(id uint32, _ uint8) { ix.drop(ws, id) })
	ws.exc, ws.over = nil, nil
}

func (ix *Index) forEachHeld(slot uint32, f func(id uint32, m uint8)) {
	d := *ix.dir.Load()
	for id := uint32(1); id < ix.next; id++ {
		n := nodeAt(d, id)
		if parentOf(n.pg.Load()) == noParent {
			continue
		}
		if m := maskIn(ix, n.holders.Load(), slot); m != 0 {
			f(id, m)
		}
	}
}

// RemoveWorker drops everything w holds and forgets w.
func (ix *Index) RemoveWorker(w kv.WorkerKey) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ws := ix.workers[w]
	if ws == nil {
		return
	}
	ix.clear(ws)
	for _, id := range ix.cand {
		ix.maybeFree(id)
	}
	ix.cand = ix.cand[:0]
	delete(ix.workers, w)
	r := ix.rankIn(w)
	ix.order = slices.Delete(ix.order, r, r+1)
	ix.slots[ws.slot] = nil
	ix.freeSlots = append(ix.freeSlots, ws.slot)
	ix.publishView(ws.slot, false)
}

// BlockCounts returns how many blocks w holds on each tier.
func (ix *Index) BlockCounts(w kv.WorkerKey) (c [kv.NumTiers]int) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ws := ix.workers[w]; ws != nil {
		for t := range c {
			c[t] = int(ws.counts[t])
		}
	}
	return c
}

// Workers lists the workers the index knows, ascending.
func (ix *Index) Workers() []kv.WorkerKey {
	v := ix.vw.Load()
	out := make([]kv.WorkerKey, len(v.slotOf))
	for r, s := range v.slotOf {
		out[r] = v.keys[s]
	}
	return out
}

// Stats returns the counters.
func (ix *Index) Stats() Stats {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	s := ix.st
	s.ReadRetries = ix.retries.Load()
	return s
}
