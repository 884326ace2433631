package index

import (
	"math/bits"
	"slices"
	"sync/atomic"
	"unsafe"

	"github.com/kvmesh/kvmesh/kv"
)

// scratch is per-query state, pooled so FindMatches does not allocate.
type scratch struct {
	alive [kv.NumTiers][]uint64 // dense mode: slots still matching tier t or faster
	tmp   []uint64              // a holder set's bitsets, when it keeps none
	hit   []uint64              // by slot: workers holding the first block
	dep   [][kv.NumTiers]uint32 // by slot
	ah    ahead                 // warmPath's turn heads
}

// cand is one survivor in sparse mode: alive for tiers >= cur.
type cand struct {
	slot uint32
	cur  uint8
}

func lowTier(m uint8) uint8 {
	if m == 0 {
		return kv.NumTiers
	}
	return uint8(bits.TrailingZeros8(m))
}

// denseEnd is where dense mode stopped: every worker whose bit is still
// set in alive[t] then held the query on tier t (or faster) down to v.
// Leaving the depth there instead of writing it into every survivor's
// entry saves a pass over the workers: the output pass reads it.
type denseEnd struct {
	alive *[kv.NumTiers][]uint64
	v     uint32
	on    bool // dense mode ran for this query (alive is valid)
}

func (d *denseEnd) all() (x [kv.NumTiers]uint32) {
	for t := range x {
		x[t] = d.v
	}
	return x
}

// depthOf is slot sl's final depth: dep[sl] on the tiers it dropped out of
// (or never held), d.v on the tiers still alive when dense mode ended.
func (d *denseEnd) depthOf(dep [][kv.NumTiers]uint32, sl uint32) [kv.NumTiers]uint32 {
	x := dep[sl]
	if !d.on {
		return x
	}
	k, b := sl>>6, sl&63
	if d.alive[kv.NumTiers-1][k]>>b&1 == 0 {
		return x
	}
	if d.alive[0][k]>>b&1 != 0 {
		return d.all()
	}
	for t := 1; t < kv.NumTiers; t++ {
		if d.alive[t][k]>>b&1 != 0 {
			x[t] = d.v
		}
	}
	return x
}

// streamAhead is how far ahead of the scan a run's nodes are prefetched.
const streamAhead = 2048

type scanEnd uint8

const (
	scanDone    scanEnd = iota // the query ended inside the run
	scanChanged                // local[i] is node parent, with holders h != prev
	scanOther                  // local[i] is not parent's successor
	scanRetry                  // a node was recycled under the reader
)

// scanChain follows successor nodes from parent while they match local[i:]
// and carry holders word prev. The loop runs over aligned slices of one
// chunk's nodes and the query, so it needs no bounds checks or chunk
// arithmetic per node. It prefetches the run ahead of itself up to stop,
// the query position where the run should end.
func scanChain(dir []*chunk, parent uint32, local []uint64, i int, prev uint64, stop int) (int, uint32, uint64, scanEnd) {
	for i < len(local) {
		sc := parent + 1
		ci := int(sc >> chunkBits)
		if ci >= len(dir) {
			return i, parent, 0, scanOther
		}
		nodes := dir[ci].hot[sc&chunkMask:]
		q := local[i:]
		if len(q) > len(nodes) {
			q = q[:len(nodes)]
		}
		// At most 64 nodes (24 lines) per pass: each pass prefetches
		// the stream streamAhead bytes ahead of itself, which the
		// hardware prefetcher alone does not keep up with (a long run
		// comes from DRAM). The call stays out of the node loop, where
		// it would cost an in-cache scan its registers.
		q = q[:min(len(q), 64)]
		nodes = nodes[:len(q)]
		if i+len(q)+streamAhead/int(unsafe.Sizeof(hot{})) <= stop {
			prefetchLines(uintptr(unsafe.Pointer(&nodes[0]))+streamAhead, 24)
		}
		want := ^parent // pg's low word for a child of parent
		for j := range q {
			n := &nodes[j]
			pg := n.pg.Load()
			if uint32(pg) != want || n.local.Load() != q[j] {
				return i + j, ^want, 0, scanOther
			}
			h := n.holders.Load()
			if n.pg.Load() != pg {
				return i + j, ^want, 0, scanRetry
			}
			want--
			if h != prev {
				return i + j, ^want, h, scanChanged
			}
		}
		i += len(q)
		parent = ^want
	}
	return i, parent, prev, scanDone
}

// maxAhead bounds the turns warmPath walks ahead.
const maxAhead = 32

// headLines is how many lines of each turn warmPath prefetches: up to
// where scanChain's own stream prefetch starts.
const headLines = streamAhead / 64

// ahead is warmPath's answer: the turn heads it expects, id[k] at query
// position pos[k]; the walk validates each as it gets there (a child of
// its parent with the query's hash) and skips that turn's table probe.
type ahead struct {
	id   [maxAhead]uint32
	pos  [maxAhead]int32
	n, k int
}

// next returns the expected head at query position i, if any.
func (ah *ahead) next(i int) uint32 {
	for ah.k < ah.n && int(ah.pos[ah.k]) < i {
		ah.k++
	}
	if ah.k < ah.n && int(ah.pos[ah.k]) == i {
		ah.k++
		return ah.id[ah.k-1]
	}
	return 0
}

// warmPath walks the query's turns ahead of the scan through child-table
// slots alone (a slot holds the next turn's head id and its run hint, so
// no node is needed to find the next slot), prefetching each head and its
// first lines, then each head's holder set. Turns of a conversation are
// often a few blocks long, too short for a prefetch issued within one turn
// to arrive in time; this way the misses of all turns overlap instead of
// following one another. It only prefetches: a stale hint costs a wasted
// line, never a wrong answer.
func (ix *Index) warmPath(t *table, dir []*chunk, local []uint64, id, run uint32, ah *ahead) {
	heads := &ah.id
	n, i := 0, 0
	for n < maxAhead && run > 0 {
		np := i + int(run)
		if np >= len(local) {
			break
		}
		hash := ix.childHash(id+run-1, local[np])
		next := uint32(0)
		for k := hash & t.mask; ; k = (k + 1) & t.mask {
			e := t.slots[k].Load()
			x := uint32(e)
			if x == 0 {
				break
			}
			if x != tomb && (e^hash)>>tagShift == 0 {
				next, run = x, runOf(e)
				break
			}
		}
		if next == 0 || int(next>>chunkBits) >= len(dir) {
			break
		}
		prefetchLines(uintptr(unsafe.Pointer(nodeAt(dir, next))), min(headLines, int(run)*24/64+1))
		heads[n], ah.pos[n] = next, int32(np)
		n++
		id, i = next, np
	}
	ah.n = n
	// Their holder sets: each head's word, then the set's directory entry,
	// then the set; every step's loads overlap across turns.
	od := *ix.ovfDir.Load()
	var ents [maxAhead]*atomic.Pointer[hset]
	m := 0
	for _, id := range heads[:n] {
		h := nodeAt(dir, id).holders.Load()
		if x := uint32(h); h&ovfFlag != 0 && int(x>>chunkBits) < len(od) {
			ents[m] = &od[x>>chunkBits][x&chunkMask]
			prefetch(uintptr(unsafe.Pointer(ents[m])))
			m++
		}
	}
	for _, e := range ents[:m] {
		if hs := e.Load(); hs != nil {
			a := uintptr(unsafe.Pointer(hs))
			prefetchLines(a&^63, int(a&63+unsafe.Sizeof(*hs)+63)/64)
		}
	}
}

// dropOut intersects the alive sets with a holder set's bitsets cum
// (starting at word lo) at query depth i, recording depth i for every
// worker that drops out of a tier, and reports whether anyone is still
// alive. A worker usually drops out of every tier at once (it held the
// block on one tier, so it was in every cumulative set): one 16-byte
// store then records all four depths. The four tiers are spelled out
// (no arrays on the stack) and a word nobody is alive in is skipped: in
// the replay's slowest finds this loop was a third of find's CPU.
// dropOut spells out four tiers.
const _, _ uint = kv.NumTiers - 4, 4 - kv.NumTiers

func dropOut(alive *[kv.NumTiers][]uint64, dep [][kv.NumTiers]uint32, cum []uint64, lo, W int, i uint32) bool {
	a0, a1, a2, a3 := alive[0][:W], alive[1][:W], alive[2][:W], alive[3][:W]
	all := [kv.NumTiers]uint32{i, i, i, i}
	any := uint64(0)
	for k := range a3 {
		x3 := a3[k]
		if x3 == 0 {
			continue // alive[3] holds every other tier's survivors
		}
		x0, x1, x2 := a0[k], a1[k], a2[k]
		var c0, c1, c2, c3 uint64
		if j := (k - lo) * kv.NumTiers; j >= 0 && j+kv.NumTiers <= len(cum) {
			c := cum[j : j+kv.NumTiers : j+kv.NumTiers]
			c0, c1, c2, c3 = c[0], c[1], c[2], c[3]
		}
		n0, n1, n2, n3 := x0&c0, x1&c1, x2&c2, x3&c3
		a0[k], a1[k], a2[k], a3[k] = n0, n1, n2, n3
		any |= n3
		d0, d1, d2, d3 := x0^n0, x1^n1, x2^n2, x3^n3
		if d0|d1|d2|d3 == 0 {
			continue
		}
		if d0 == d3 && d1 == d3 && d2 == d3 {
			for x := d3; x != 0; x &= x - 1 {
				dep[k*64+bits.TrailingZeros64(x)] = all
			}
			continue
		}
		for tt, d := range [kv.NumTiers]uint64{d0, d1, d2, d3} {
			for x := d; x != 0; x &= x - 1 {
				dep[k*64+bits.TrailingZeros64(x)][tt] = i
			}
		}
	}
	return any != 0
}

// childAt is lookup's answer (node id and holders word) for the child of
// parent with hash local, trying node want first (0: none): a
// validated node is the child, as the table's entry would be.
func (ix *Index) childAt(t *table, dir []*chunk, parent uint32, local uint64, want uint32) (uint32, uint64, []*chunk, bool) {
	if want != 0 && int(want>>chunkBits) < len(dir) {
		n := nodeAt(dir, want)
		pg := n.pg.Load()
		if parentOf(pg) == parent && n.local.Load() == local {
			h := n.holders.Load()
			return want, h, dir, n.pg.Load() == pg
		}
	}
	id, _, h, dir, _, ok := ix.lookup(t, dir, parent, local)
	return id, h, dir, ok
}

// FindMatches appends to dst one Match per worker key with
// Depth[kv.NumTiers-1] > 0, in ascending WorkerKey order, and returns it.
// It takes no lock and may run concurrently with writers; under concurrent
// writes it reflects some mix of states each reader observed atomically.
func (ix *Index) FindMatches(local []kv.LocalHash, dst []Match) []Match {
	if len(local) == 0 {
		return dst
	}
	s := ix.scratch.Get().(*scratch)
	start := len(dst)
	raw := kv.RawHashes(local) // the tables key by raw uint64
	for {
		var ok bool
		dst, ok = ix.find(raw, dst, s, nil)
		if ok {
			break
		}
		ix.retries.Add(1)
		dst = dst[:start]
	}
	ix.scratch.Put(s)
	return dst
}

// scatter asks find to read view v and write its answer into out at the
// given positions rather than append it, when every live worker of v
// matched: pos[sl] is where the worker in slot sl goes (Sharded's merged
// order). find sets done when it did; otherwise it wrote nothing.
type scatter struct {
	v    *view
	pos  []uint32
	out  []Match
	done bool
}

// findScatter is FindMatches for Sharded: it reports whether it wrote the
// answer through sc (false: not every live worker of sc.v matched;
// nothing written).
func (ix *Index) findScatter(local []kv.LocalHash, sc *scatter) bool {
	if len(local) == 0 {
		return false
	}
	s := ix.scratch.Get().(*scratch)
	raw := kv.RawHashes(local)
	sc.done = false
	for {
		if _, ok := ix.find(raw, nil, s, sc); ok {
			break
		}
		ix.retries.Add(1)
	}
	ix.scratch.Put(s)
	return sc.done
}

func (ix *Index) find(local []uint64, dst []Match, s *scratch, sc *scatter) ([]Match, bool) {
	v := ix.vw.Load()
	if sc != nil {
		// The placement's view, which may be older than the shard's
		// latest by workers who joined since the Sharded find began:
		// as if this shard's find had read its view then. A newer
		// worker's blocks are left out like those of any slot outside
		// the view (or not live in it).
		v = sc.v
	}
	t := ix.ctab.Load()
	dir := *ix.dir.Load()
	W := v.words
	if len(v.keys) == 0 || len(v.slotOf) == 0 {
		if sc != nil {
			sc.done = true // nobody to place
		}
		return dst, true
	}
	if cap(s.hit) < W {
		s.hit = make([]uint64, W)
		for i := range s.alive {
			s.alive[i] = make([]uint64, W)
		}
		s.tmp = make([]uint64, W*kv.NumTiers)
	}
	if cap(s.dep) < len(v.keys) {
		s.dep = make([][kv.NumTiers]uint32, len(v.keys)+64)
	}
	hit := s.hit[:W]
	clear(hit)
	dep := s.dep[:len(v.keys)]
	var cs [2]cand
	nc := 0
	dense := false
	de := denseEnd{alive: &s.alive}
	var last uint64 = ^uint64(0) // valid slots in the last word
	if r := len(v.keys) % 64; r != 0 {
		last = 1<<r - 1
	}
	id, _, h, dir, run, ok := ix.lookup(t, dir, 0, local[0])
	if !ok {
		return dst, false
	}
	if id == 0 {
		return dst, true
	}
	if id == 1 {
		run = ix.rootRun.Load()
	}
	ah := &s.ah
	ah.n, ah.k = 0, 0
	if run > 0 {
		ix.warmPath(t, dir, local, id, run, ah)
	}
	// Level 0 seeds the survivors.
	if h&ovfFlag != 0 {
		hs := ix.setOf(h)
		if hs == nil {
			return dst, false
		}
		cum, lo := hs.bitsets(s.tmp[:W*kv.NumTiers])
		dense = true
		de.on = true
		for k := 0; k < W; k++ {
			for tt := 0; tt < kv.NumTiers; tt++ {
				var c uint64
				if j := (k-lo)*kv.NumTiers + tt; j >= 0 && j < len(cum) {
					c = cum[j]
				}
				if k == W-1 {
					c &= last
				}
				s.alive[tt][k] = c
			}
		}
		for k := 0; k < W; k++ {
			for tt := 0; tt < kv.NumTiers-1; tt++ {
				for d := s.alive[kv.NumTiers-1][k] &^ s.alive[tt][k]; d != 0; d &= d - 1 {
					dep[k*64+bits.TrailingZeros64(d)][tt] = 0
				}
			}
			hit[k] = s.alive[kv.NumTiers-1][k]
		}
	} else {
		for _, e := range [2]uint32{uint32(h), uint32(h >> 32)} {
			if e != 0 && int(e>>4) < len(v.keys) {
				sl := e >> 4
				cs[nc] = cand{slot: sl, cur: lowTier(uint8(e & 15))}
				hit[sl>>6] |= 1 << (sl & 63)
				for tt := uint8(0); tt < cs[nc].cur; tt++ {
					dep[sl][tt] = 0
				}
				nc++
			}
		}
	}
	parent, prev := id, h
	depth := len(local)
	for i := 1; i < len(local); i++ {
		// Fast path: a run of successor nodes with the holders word of the
		// level above (nobody drops out) is one sequential scan.
		var st scanEnd
		stop := len(local) // where the run should end: the next expected turn
		if ah.k < ah.n {
			stop = int(ah.pos[ah.k])
		}
		i, parent, h, st = scanChain(dir, parent, local, i, prev, stop)
		switch st {
		case scanDone:
			continue // i == len(local): the loop ends
		case scanRetry:
			return dst, false
		case scanChanged:
			goto changed
		}
		id, h, dir, ok = ix.childAt(t, dir, parent, local[i], ah.next(i))
		if !ok {
			return dst, false
		}
		if id == 0 {
			depth = i
			break
		}
		parent = id
		if h == prev {
			continue // the same holders as the level above: nobody drops out
		}
	changed:
		prev = h
		if dense {
			if h&ovfFlag != 0 {
				hs := ix.setOf(h)
				if hs == nil {
					return dst, false
				}
				cum, lo := hs.bitsets(s.tmp[:W*kv.NumTiers])
				if !dropOut(&s.alive, dep, cum, lo, W, uint32(i)) {
					depth = -1
					break
				}
				continue
			}
			// Inline node: at most two survivors remain; go sparse.
			dense = false
			nc = 0
			for _, e := range [2]uint32{uint32(h), uint32(h >> 32)} {
				if e == 0 {
					continue
				}
				sl := e >> 4
				k, b := int(sl>>6), uint64(1)<<(sl&63)
				if k >= W || s.alive[kv.NumTiers-1][k]&b == 0 {
					continue
				}
				cur := uint8(0)
				for cur < kv.NumTiers && s.alive[cur][k]&b == 0 {
					cur++
				}
				cs[nc] = cand{slot: sl, cur: cur}
				nc++
			}
			// Everyone else still alive drops out here: the kept two
			// leave the alive sets, which then record the rest.
			for _, c := range cs[:nc] {
				for tt := range s.alive {
					s.alive[tt][c.slot>>6] &^= 1 << (c.slot & 63)
				}
			}
			de.v = uint32(i)
			// fall through to the sparse step for this same node
		}
		live := 0
		for j := 0; j < nc; j++ {
			c := &cs[j]
			if c.cur >= kv.NumTiers {
				continue
			}
			var m uint8
			if h&ovfFlag == 0 {
				m = maskIn(ix, h, c.slot)
			} else if hs := ix.setOf(h); hs != nil {
				m = hs.mask(c.slot)
			} else {
				return dst, false
			}
			low := lowTier(m)
			for ; c.cur < low && c.cur < kv.NumTiers; c.cur++ {
				dep[c.slot][c.cur] = uint32(i)
			}
			if c.cur < kv.NumTiers {
				live++
			}
		}
		if live == 0 {
			depth = -1
			break
		}
	}
	if depth >= 0 {
		if dense {
			de.v = uint32(depth)
		} else {
			for j := 0; j < nc; j++ {
				for c := cs[j].cur; c < kv.NumTiers; c++ {
					dep[cs[j].slot][c] = uint32(depth)
				}
			}
		}
	}
	nm := 0
	for k := 0; k < W; k++ {
		// A slot not live in v may hold blocks: a worker whose first
		// event is being applied, in a slot a removed one left.
		hit[k] &= v.live[k]
		nm += bits.OnesCount64(hit[k])
	}
	if sc != nil {
		if nm == len(v.slotOf) && slices.Equal(hit, v.live) {
			scatterMatches(sc.out, sc.pos, v, dep, &de)
			sc.done = true
		}
		return dst, true
	}
	if nm <= 2 {
		var sl [2]uint32
		j := 0
		for k := 0; k < W; k++ {
			for x := hit[k]; x != 0; x &= x - 1 {
				sl[j] = uint32(k*64 + bits.TrailingZeros64(x))
				j++
			}
		}
		if j == 2 && less(v.keys[sl[1]], v.keys[sl[0]]) {
			sl[0], sl[1] = sl[1], sl[0]
		}
		for _, x := range sl[:j] {
			dst = append(dst, Match{Worker: v.keys[x], Depth: de.depthOf(dep, x)})
		}
		return dst, true
	}
	return appendMatches(dst, v, hit, dep, &de, nm), true
}

// scatterMatches writes the answer of a find every live worker of v
// matched into out, the worker in slot sl at pos[sl]. It walks the slots
// in order, so keys and depths are read in sequence and only the stores
// are spread over the answer; merging the shards' answers instead (a
// branch on interleaved keys, mispredicted every other worker) cost as
// much as the finds.
func scatterMatches(out []Match, pos []uint32, v *view, dep [][kv.NumTiers]uint32, de *denseEnd) {
	keys := v.keys
	pos = pos[:len(keys)]
	dep = dep[:len(keys)]
	if !de.on {
		for k, w := range v.live {
			for x := w; x != 0; x &= x - 1 {
				sl := uint32(k*64 + bits.TrailingZeros64(x))
				out[pos[sl]] = Match{Worker: keys[sl], Depth: de.depthOf(dep, sl)}
			}
		}
		return
	}
	a0, a3 := de.alive[0], de.alive[kv.NumTiers-1]
	all := de.all()
	for k, w := range v.live {
		alive0, alive3 := a0[k], a3[k]
		for x := w; x != 0; x &= x - 1 {
			b := bits.TrailingZeros64(x)
			sl := uint32(k*64 + b)
			m := &out[pos[sl]]
			m.Worker = keys[sl]
			switch {
			case alive0>>b&1 != 0:
				m.Depth = all
			case alive3>>b&1 == 0:
				m.Depth = dep[sl]
			default:
				m.Depth = de.depthOf(dep, sl)
			}
		}
	}
}

// appendMatches appends the nm workers in hit, in key order.
func appendMatches(dst []Match, v *view, hit []uint64, dep [][kv.NumTiers]uint32, de *denseEnd, nm int) []Match {
	n0 := len(dst)
	dst = slices.Grow(dst, nm)[:n0+nm]
	out, keys := dst[n0:], v.keys
	if nm == len(v.slotOf) && de.on && slices.Equal(hit, v.live) {
		// Everyone matched (a shared prefix): no hit tests, and most
		// workers are still alive in one dense state.
		a0, a3 := de.alive[0], de.alive[kv.NumTiers-1]
		all := de.all()
		for r, sl := range v.slotOf[:len(out)] {
			m := &out[r]
			m.Worker = keys[sl]
			k, b := sl>>6, sl&63
			switch {
			case a0[k]>>b&1 != 0: // alive on every tier
				m.Depth = all
			case a3[k]>>b&1 == 0: // dropped out or kept in sparse mode
				m.Depth = dep[sl]
			default:
				m.Depth = de.depthOf(dep, sl)
			}
		}
		return dst
	}
	// Many matches: walk the workers in key order and test each.
	j := 0
	for _, sl := range v.slotOf {
		if hit[sl>>6]>>(sl&63)&1 != 0 && j < len(out) {
			m := &out[j]
			m.Worker, m.Depth = keys[sl], de.depthOf(dep, sl)
			j++
		}
	}
	return dst[:n0+j]
}
