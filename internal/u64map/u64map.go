// Package u64map owns kvmesh's open-addressing map from uint64 keys
// (block hashes of any ~uint64 type) to small values: linear probing with backward-shift
// deletion, so the constant insert/evict churn of a cache leaves no
// tombstones and no long probe runs (Go maps slow down under it), and a key
// shares its slot with its value, so a lookup is usually one cache miss.
// It imports nothing; keep its methods inlinable and allocation-free
// except for growing.
package u64map

// golden spreads keys over the table: Fibonacci hashing, multiply by
// 2^64/φ and keep the top bits.
const golden = 0x9E3779B97F4A7C15

// Map maps keys K (a 64-bit hash type) to V. The zero Map is empty and
// ready to use.
type Map[K ~uint64, V any] struct {
	slots   []slot[K, V] // key 0 marks an empty slot; the key 0 lives in zero
	shift   uint
	n       int
	hasZero bool
	zero    V
}

type slot[K ~uint64, V any] struct {
	key K
	val V
}

const minBits = 3

// New returns a map that holds capacity keys without growing.
func New[K ~uint64, V any](capacity int) Map[K, V] {
	bits := uint(minBits)
	for 1<<bits < 2*capacity {
		bits++
	}
	return Map[K, V]{slots: make([]slot[K, V], 1<<bits), shift: 64 - bits}
}

// Len is the number of keys.
func (m *Map[K, V]) Len() int { return m.n }

func (m *Map[K, V]) home(k K) int { return int((uint64(k) * golden) >> m.shift) }

// Get returns k's value and whether k is present.
func (m *Map[K, V]) Get(k K) (V, bool) {
	if k == 0 {
		return m.zero, m.hasZero
	}
	mask := len(m.slots) - 1
	if mask < 0 {
		var none V
		return none, false
	}
	for i := m.home(k); ; i = (i + 1) & mask {
		switch m.slots[i].key {
		case k:
			return m.slots[i].val, true
		case 0:
			var none V
			return none, false
		}
	}
}

// Touch loads k's home slot and returns its key, which the caller keeps
// (adds into a field) so the load is not optimised away: touching the
// slots of a batch of lookups before making them lets their cache misses
// overlap instead of queueing one lookup at a time.
func (m *Map[K, V]) Touch(k K) K {
	if len(m.slots) == 0 {
		return 0
	}
	return m.slots[m.home(k)].key
}

// Set stores k → v and reports whether k is new.
func (m *Map[K, V]) Set(k K, v V) bool {
	if k == 0 {
		added := !m.hasZero
		if added {
			m.n++
		}
		m.hasZero, m.zero = true, v
		return added
	}
	if 2*(m.n+1) > len(m.slots) {
		m.grow()
	}
	mask := len(m.slots) - 1
	for i := m.home(k); ; i = (i + 1) & mask {
		switch m.slots[i].key {
		case k:
			m.slots[i].val = v
			return false
		case 0:
			m.slots[i] = slot[K, V]{k, v}
			m.n++
			return true
		}
	}
}

// grow doubles the table (load stays ≤ 1/2, so probe runs stay short).
func (m *Map[K, V]) grow() {
	bits := uint(minBits)
	if m.slots != nil {
		bits = 64 - m.shift + 1
	}
	old := m.slots
	m.slots, m.shift = make([]slot[K, V], 1<<bits), 64-bits
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

// Delete removes k if present, shifting later entries of its probe run
// back.
func (m *Map[K, V]) Delete(k K) {
	var none V
	if k == 0 {
		if m.hasZero {
			m.hasZero, m.zero = false, none
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
			m.slots[i] = slot[K, V]{}
			return
		}
		// kj may move to the hole at i unless its home lies cyclically in (i, j].
		if h := m.home(kj); (j-h)&mask >= (j-i)&mask {
			m.slots[i] = m.slots[j]
			i = j
		}
	}
}
