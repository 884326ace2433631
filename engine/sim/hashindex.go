package sim

// hashIndex maps sequence hashes to block ids: open addressing with linear
// probing and backward-shift deletion, so the constant insert/evict churn of
// a cache leaves no tombstones (Go maps slow down under it). Its capacity
// is fixed: the pool never registers more hashes than it has blocks.
type hashIndex struct {
	keys    []uint64 // 0 = empty slot; the key 0 itself lives in zero*
	ids     []int32
	shift   uint
	n       int
	hasZero bool
	zeroID  int32
}

func newHashIndex(capacity int) hashIndex {
	bits := uint(3)
	for 1<<bits < 2*capacity {
		bits++
	}
	return hashIndex{keys: make([]uint64, 1<<bits), ids: make([]int32, 1<<bits), shift: 64 - bits}
}

func (h *hashIndex) len() int { return h.n }

func (h *hashIndex) home(k uint64) int { return int((k * 0x9E3779B97F4A7C15) >> h.shift) }

func (h *hashIndex) get(k uint64) (int32, bool) {
	if k == 0 {
		return h.zeroID, h.hasZero
	}
	mask := len(h.keys) - 1
	for i := h.home(k); ; i = (i + 1) & mask {
		switch h.keys[i] {
		case k:
			return h.ids[i], true
		case 0:
			return -1, false
		}
	}
}

// put sets k → id.
func (h *hashIndex) put(k uint64, id int32) {
	if k == 0 {
		if !h.hasZero {
			h.n++
		}
		h.hasZero, h.zeroID = true, id
		return
	}
	mask := len(h.keys) - 1
	for i := h.home(k); ; i = (i + 1) & mask {
		switch h.keys[i] {
		case k:
			h.ids[i] = id
			return
		case 0:
			h.keys[i], h.ids[i] = k, id
			h.n++
			return
		}
	}
}

// del removes k if present, shifting later entries of its probe run back.
func (h *hashIndex) del(k uint64) {
	if k == 0 {
		if h.hasZero {
			h.hasZero = false
			h.n--
		}
		return
	}
	mask := len(h.keys) - 1
	i := h.home(k)
	for ; h.keys[i] != k; i = (i + 1) & mask {
		if h.keys[i] == 0 {
			return
		}
	}
	h.n--
	for j := i; ; {
		j = (j + 1) & mask
		kj := h.keys[j]
		if kj == 0 {
			h.keys[i] = 0
			return
		}
		// kj may move to the hole at i unless its home lies cyclically in (i, j].
		if hm := h.home(kj); (j-hm)&mask >= (j-i)&mask {
			h.keys[i], h.ids[i] = kj, h.ids[j]
			i = j
		}
	}
}
