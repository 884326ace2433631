package index

// stampMap maps a block's sequence hash to a stamp (never 0): open
// addressing with linear probing and backward-shift deletion. Approx
// stamps and expires entries at a high rate, and a Go map under that
// insert/delete churn accumulates tombstones and long probe runs; here a
// key and its stamp share a slot, so a lookup is usually one cache miss.
type stampMap struct {
	slots   []stampSlot // key 0 marks an empty slot; the key 0 lives in zero
	shift   uint
	n       int
	hasZero bool
	zero    uint64
}

type stampSlot struct{ key, stamp uint64 }

const stampMinBits = 4

func (m *stampMap) len() int { return m.n }

func (m *stampMap) home(k uint64) int { return int((k * 0x9E3779B97F4A7C15) >> m.shift) }

// get returns k's stamp, 0 when k is absent.
func (m *stampMap) get(k uint64) uint64 {
	if k == 0 {
		return m.zero
	}
	if m.slots == nil {
		return 0
	}
	mask := len(m.slots) - 1
	for i := m.home(k); ; i = (i + 1) & mask {
		switch m.slots[i].key {
		case k:
			return m.slots[i].stamp
		case 0:
			return 0
		}
	}
}

// set stores k → stamp and reports whether k is new.
func (m *stampMap) set(k, stamp uint64) bool {
	if k == 0 {
		added := !m.hasZero
		if added {
			m.n++
		}
		m.hasZero, m.zero = true, stamp
		return added
	}
	if 2*(m.n+1) > len(m.slots) {
		m.grow()
	}
	mask := len(m.slots) - 1
	for i := m.home(k); ; i = (i + 1) & mask {
		switch m.slots[i].key {
		case k:
			m.slots[i].stamp = stamp
			return false
		case 0:
			m.slots[i] = stampSlot{k, stamp}
			m.n++
			return true
		}
	}
}

// grow doubles the table (load stays ≤ 1/2, so probe runs stay short).
func (m *stampMap) grow() {
	bits := uint(stampMinBits)
	if m.slots != nil {
		bits = 64 - m.shift + 1
	}
	old := m.slots
	m.slots, m.shift = make([]stampSlot, 1<<bits), 64-bits
	mask := len(m.slots) - 1
	for _, s := range old {
		if s.key == 0 {
			continue
		}
		i := m.home(s.key)
		for m.slots[i].key != 0 {
			i = (i + 1) & mask
		}
		m.slots[i] = s
	}
}

// del removes k if present, shifting later entries of its probe run back.
func (m *stampMap) del(k uint64) {
	if k == 0 {
		if m.hasZero {
			m.hasZero, m.zero = false, 0
			m.n--
		}
		return
	}
	if m.slots == nil {
		return
	}
	mask := len(m.slots) - 1
	i := m.home(k)
	for ; m.slots[i].key != k; i = (i + 1) & mask {
		if m.slots[i].key == 0 {
			return
		}
	}
	m.n--
	for j := i; ; {
		j = (j + 1) & mask
		kj := m.slots[j].key
		if kj == 0 {
			m.slots[i].key = 0
			return
		}
		// kj may move to the hole at i unless its home lies cyclically in (i, j].
		if h := m.home(kj); (j-h)&mask >= (j-i)&mask {
			m.slots[i] = m.slots[j]
			i = j
		}
	}
}
