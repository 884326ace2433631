package kvbm

import (
	"errors"
	"fmt"

	"github.com/kvmesh/kvmesh/clock"
	"github.com/kvmesh/kvmesh/internal/streamcopy"
	"github.com/kvmesh/kvmesh/kv"
)

// DeviceBlockID is a block index in the engine's device KV cache (G1).
type DeviceBlockID int32

// Device is the engine's KV cache as kvbm sees it: the bytes of a device
// block, every layer concatenated (Config.BlockBytes long), aliasing device
// memory. The engine implements it; kvbm reads a view to offload a block
// the forward pass completed and writes one to onboard a block. A view is
// used only until the next call into the Device.
type Device interface {
	ReadView(id DeviceBlockID) ([]byte, error)
	WriteView(id DeviceBlockID) ([]byte, error)
}

// PieceDevice is a Device whose blocks are not one contiguous run (the
// sidecar's piece-by-piece staging): kvbm copies a block between a host
// tier slot and the device through these instead of a view, so the pieces
// pass once. ReadBlock copies device block id into dst (BlockBytes long,
// a host slot: streaming stores) and returns kv.Checksum of the block;
// WriteBlock copies src into device block id.
type PieceDevice interface {
	ReadBlock(id DeviceBlockID, dst []byte) (sum uint64, err error)
	WriteBlock(id DeviceBlockID, src []byte) error
}

// Checksummer is a Device that knows the kv.Checksum of its blocks' bytes
// (the sim keeps one per block as it stores it): kvbm then carries that
// checksum with the offloaded block instead of hashing the bytes again.
// The bytes are still verified against it on every onboard.
type Checksummer interface {
	BlockChecksum(id DeviceBlockID) (uint64, bool)
}

// Config describes a Manager. Host and Disk are optional: with neither the
// manager holds nothing; with Disk only it runs in "bypass host" mode.
// Object (G4) is optional too: it keeps what the last local tier evicts.
type Config struct {
	BlockSize  int // tokens per block
	BlockBytes int // bytes per block (every layer)
	Host       Storage
	Disk       Storage
	Object     Storage
	Clock      clock.Clock // the disk filter's time; Wall if nil
	DiskFilter FilterConfig
	Worker     kv.WorkerKey // stamped on events
	Events     EventSink
}

// Stats are a Manager's running totals, in blocks unless named otherwise.
type Stats struct {
	HostBlocks, DiskBlocks, ObjectBlocks int // held now

	OffloadedHost, OffloadedDisk uint64 // written to the tier
	OffloadedObject              uint64 // evicted from the last local tier, written to the object tier
	DedupHost, DedupDisk         uint64 // offers skipped: already held
	FilteredDisk                 uint64 // host blocks the disk filter declined
	FullHost, FullDisk           uint64 // offers dropped: every slot pinned
	EvictedHost, EvictedDisk     uint64
	EvictedObject                uint64
	MatchedHost, MatchedDisk     uint64 // staged for onboarding
	MatchedObject                uint64
	DeclinedLoad                 uint64 // matched blocks left to recompute: cheaper than loading them (LoadCost)
	OnboardedHost, OnboardedDisk uint64 // copied to the device and verified
	OnboardedObject              uint64 // through host when there is one
	Corrupt                      uint64 // failed verification, dropped
	RecoveredDisk                uint64 // found intact by RecoverDisk
	RecoveredObject              uint64 // found intact by RecoverObject
	// Asynchronous object writes (an AsyncPutter object storage):
	PendingObject int    // queued or being written now, not yet registered
	DroppedObject uint64 // evicted blocks not written: the queue was full (a recompute if wanted again)
	FailedObject  uint64 // written but failed or not verified (also in Errors)
	Errors        uint64 // storage or device I/O errors
}

// Manager is the block manager core: tiers, offload, match and onboard.
// It is not safe for concurrent use and starts no goroutines.
type Manager struct {
	cfg    Config
	clk    clock.Clock
	host   *pool // nil: no host tier
	disk   *pool // nil: no disk tier
	obj    *pool // nil: no object tier
	filter *FrequencyFilter
	ev     eventLog
	bounce []byte
	st     Stats
	// async is the object storage's queue when its writes run elsewhere;
	// objPending maps the blocks queued there to their object slots.
	async      AsyncPutter
	objPending map[kv.SeqHash]int32
	done       []PutResult
}

// NewManager builds a Manager over the given storages.
func NewManager(cfg Config) (*Manager, error) {
	if cfg.BlockSize <= 0 || cfg.BlockBytes <= 0 {
		return nil, fmt.Errorf("kvbm: block size %d tokens / %d bytes, want both > 0", cfg.BlockSize, cfg.BlockBytes)
	}
	m := &Manager{cfg: cfg, clk: cfg.Clock}
	if m.clk == nil {
		m.clk = clock.NewWall()
	}
	m.ev = eventLog{sink: cfg.Events, worker: cfg.Worker}
	for _, s := range []struct {
		st   Storage
		name string
		t    kv.Tier
		p    **pool
	}{{cfg.Host, "host", kv.TierHost, &m.host}, {cfg.Disk, "disk", kv.TierDisk, &m.disk},
		{cfg.Object, "object", kv.TierExternal, &m.obj}} {
		if s.st == nil {
			continue
		}
		if s.st.BlockBytes() != cfg.BlockBytes {
			return nil, fmt.Errorf("kvbm: %s storage has %d-byte blocks, want %d", s.name, s.st.BlockBytes(), cfg.BlockBytes)
		}
		*s.p = newPool(s.t, s.st, &m.ev)
	}
	if m.obj != nil {
		if m.host == nil && m.disk == nil {
			return nil, errors.New("kvbm: an object tier needs a host or disk tier in front of it")
		}
		for _, p := range []*pool{m.host, m.disk} {
			if p != nil {
				p.onEvict = m.toObject
			}
		}
		if a, ok := cfg.Object.(AsyncPutter); ok {
			m.async, m.objPending = a, map[kv.SeqHash]int32{}
		}
	}
	if m.host != nil && m.disk != nil {
		// Bypass mode offloads unfiltered, as Dynamo's does.
		m.filter = NewFrequencyFilter(cfg.DiskFilter, m.clk.Now())
	}
	return m, nil
}

// BlockSize is the tokens per block.
func (m *Manager) BlockSize() int { return m.cfg.BlockSize }

// BypassHost reports whether offload goes straight to disk.
func (m *Manager) BypassHost() bool { return m.host == nil && m.disk != nil }

// Stats returns the running totals.
func (m *Manager) Stats() Stats {
	st := m.st
	if m.host != nil {
		st.HostBlocks, st.EvictedHost = m.host.len(), m.host.evicted
	}
	if m.disk != nil {
		st.DiskBlocks, st.EvictedDisk = m.disk.len(), m.disk.evicted
	}
	if m.obj != nil {
		st.ObjectBlocks, st.EvictedObject = m.obj.len(), m.obj.evicted
	}
	st.PendingObject = len(m.objPending)
	return st
}

// HoldsObject reports whether the object tier holds h or is writing it.
func (m *Manager) HoldsObject(h kv.SeqHash) bool {
	if m.obj == nil {
		return false
	}
	_, ok := m.obj.lookup(h)
	if !ok {
		_, ok = m.objPending[h]
	}
	return ok
}

// toObject is a local tier evicting slot s: the block goes to the object
// tier unless that holds it already or the other local tier still does
// (it goes when that one evicts it). The slot's bytes are intact until
// the caller overwrites them.
func (m *Manager) toObject(p *pool, s int32) {
	meta := p.slots[s].meta
	if m.HoldsObject(meta.Seq) {
		return
	}
	for _, q := range []*pool{m.host, m.disk} {
		if q != nil && q != p {
			if _, ok := q.lookup(meta.Seq); ok {
				return
			}
		}
	}
	if m.async != nil && m.async.Full() {
		// Offload never waits for the bucket: this copy is lost.
		m.st.DroppedObject++
		return
	}
	var src []byte
	if v, ok := p.store.(Viewer); ok {
		src = v.View(int(s))
	} else {
		src = m.scratch()
		if err := p.store.Get(int(s), src); err != nil {
			m.st.Errors++
			return
		}
	}
	o, ok := m.obj.alloc()
	if !ok {
		return
	}
	if m.async != nil {
		m.putAsync(o, src, meta)
		return
	}
	if err := m.obj.store.Put(int(o), src, meta); err != nil {
		m.obj.release(o)
		m.st.Errors++
		return
	}
	m.obj.register(o, meta)
	m.st.OffloadedObject++
}

// Holds reports which tiers hold h.
func (m *Manager) Holds(h kv.SeqHash) (host, disk bool) {
	if m.host != nil {
		_, host = m.host.lookup(h)
	}
	if m.disk != nil {
		_, disk = m.disk.lookup(h)
	}
	return host, disk
}

// StoreBlock is one device block to offload.
type StoreBlock struct {
	Device DeviceBlockID
	Meta   BlockMeta // Sum is computed from the device's bytes
}

// Offload writes device blocks through to the host tier (to disk in
// bypass mode); host blocks the filter admits go on to disk. It returns how
// many blocks the first tier now holds anew; a block already held is
// skipped, one that finds every slot pinned is dropped (both counted).
func (m *Manager) Offload(dev Device, blocks []StoreBlock) (int, error) {
	defer m.ev.flush()
	m.settle()
	n := 0
	var errs []error
	for _, b := range blocks {
		ok, err := m.offloadOne(dev, b)
		if ok {
			n++
		}
		if err != nil {
			m.st.Errors++
			errs = append(errs, err)
		}
	}
	if err := m.commit(); err != nil {
		errs = append(errs, err)
	}
	return n, errors.Join(errs...)
}

// commit finishes the storages' batched writes (the disk's slot headers).
func (m *Manager) commit() error {
	var errs []error
	for _, p := range []*pool{m.host, m.disk, m.obj} {
		if p == nil {
			continue
		}
		if c, ok := p.store.(Committer); ok {
			if err := c.Commit(); err != nil {
				m.st.Errors++
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func (m *Manager) offloadOne(dev Device, b StoreBlock) (bool, error) {
	p := m.host
	if p == nil {
		p = m.disk
	}
	if p == nil {
		return false, nil
	}
	if s, ok := p.lookup(b.Meta.Seq); ok {
		m.count(p, &m.st.DedupHost, &m.st.DedupDisk)
		if p == m.host {
			return false, m.offerDisk(s)
		}
		return false, nil
	}
	if pd, ok := dev.(PieceDevice); ok {
		if v, isView := p.store.(Viewer); isView {
			return m.offloadPieces(pd, p, v, b)
		}
	}
	src, err := dev.ReadView(b.Device)
	if err != nil {
		return false, fmt.Errorf("kvbm: offload block %016x from device block %d: %w", uint64(b.Meta.Seq), b.Device, err)
	}
	if len(src) != m.cfg.BlockBytes {
		return false, fmt.Errorf("kvbm: device block %d has %d bytes, want %d", b.Device, len(src), m.cfg.BlockBytes)
	}
	s, ok := p.alloc()
	if !ok {
		m.count(p, &m.st.FullHost, &m.st.FullDisk)
		return false, nil
	}
	meta := b.Meta
	known := false
	if cs, ok := dev.(Checksummer); ok {
		meta.Sum, known = cs.BlockChecksum(b.Device)
	}
	_, isView := p.store.(Viewer)
	sealer, seals := p.store.(Sealer)
	if !known && (isView || seals) {
		// Write first, then hash the device's bytes while the write has
		// them in cache: they are read from memory once (hashing first
		// costs a second pass at memory speed), and the host arena's
		// copy, written with streaming stores, is not in cache. The slot
		// is private until register; a disk header gets the sum by Seal.
		if err := p.store.Put(int(s), src, meta); err != nil {
			p.release(s)
			return false, err
		}
		meta.Sum = kv.Checksum(src)
		if seals {
			sealer.Seal(int(s), meta)
		}
	} else {
		if !known {
			// The header written with the payload carries the sum.
			meta.Sum = kv.Checksum(src)
		}
		if err := p.store.Put(int(s), src, meta); err != nil {
			p.release(s)
			return false, err
		}
	}
	p.register(s, meta)
	m.count(p, &m.st.OffloadedHost, &m.st.OffloadedDisk)
	if p == m.host {
		return true, m.offerDisk(s)
	}
	return true, nil
}

// offloadPieces offloads b from a PieceDevice straight into a slot of
// p's arena, hashed as the device copies it.
func (m *Manager) offloadPieces(pd PieceDevice, p *pool, v Viewer, b StoreBlock) (bool, error) {
	s, ok := p.alloc()
	if !ok {
		m.count(p, &m.st.FullHost, &m.st.FullDisk)
		return false, nil
	}
	meta := b.Meta
	sum, err := pd.ReadBlock(b.Device, v.View(int(s)))
	if err != nil {
		p.release(s)
		return false, fmt.Errorf("kvbm: offload block %016x from device block %d: %w", uint64(b.Meta.Seq), b.Device, err)
	}
	meta.Sum = sum
	p.register(s, meta)
	m.count(p, &m.st.OffloadedHost, &m.st.OffloadedDisk)
	if p == m.host {
		return true, m.offerDisk(s)
	}
	return true, nil
}

// offerDisk is one sighting of host slot s: copy it to disk if the filter
// admits it and disk does not hold it yet.
func (m *Manager) offerDisk(s int32) error {
	if m.disk == nil {
		return nil
	}
	meta := m.host.slots[s].meta
	if _, ok := m.disk.lookup(meta.Seq); ok {
		m.st.DedupDisk++
		return nil
	}
	if !m.filter.ShouldOffload(meta.Seq, m.clk.Now()) {
		m.st.FilteredDisk++
		return nil
	}
	var src []byte
	if v, ok := m.host.store.(Viewer); ok {
		src = v.View(int(s))
	} else {
		src = m.scratch()
		if err := m.host.store.Get(int(s), src); err != nil {
			return err
		}
	}
	d, ok := m.disk.alloc()
	if !ok {
		m.st.FullDisk++
		return nil
	}
	if err := m.disk.store.Put(int(d), src, meta); err != nil {
		m.disk.release(d)
		return err
	}
	m.disk.register(d, meta)
	m.st.OffloadedDisk++
	return nil
}

func (m *Manager) scratch() []byte {
	if m.bounce == nil {
		m.bounce = make([]byte, m.cfg.BlockBytes)
	}
	return m.bounce
}

func (m *Manager) count(p *pool, host, disk *uint64) {
	if p == m.host {
		*host++
	} else {
		*disk++
	}
}

// Staged is one matched block, pinned in its tier until it is onboarded or
// released.
type Staged struct {
	Tier kv.Tier
	slot int32
	Meta BlockMeta
}

// Match pins the longest prefix of seqs held by the host tier, then
// continues on disk from where host stopped, appending the pinned blocks to
// dst. Every staged block must later go through Onboard or Release.
func (m *Manager) Match(dst []Staged, seqs []kv.SeqHash) []Staged {
	defer m.ev.flush()
	m.settle()
	i := 0
	if m.host != nil {
		for ; i < len(seqs); i++ {
			s, ok := m.host.lookup(seqs[i])
			if !ok {
				break
			}
			m.host.acquire(s)
			dst = append(dst, Staged{Tier: kv.TierHost, slot: s, Meta: m.host.slots[s].meta})
			m.st.MatchedHost++
			// A host hit is a sighting for the disk filter.
			if err := m.offerDisk(s); err != nil {
				m.st.Errors++
			}
		}
		if err := m.commit(); err != nil {
			m.st.Errors++
		}
	}
	if m.disk != nil {
		for ; i < len(seqs); i++ {
			s, ok := m.disk.lookup(seqs[i])
			if !ok {
				break
			}
			m.disk.acquire(s)
			dst = append(dst, Staged{Tier: kv.TierDisk, slot: s, Meta: m.disk.slots[s].meta})
			m.st.MatchedDisk++
		}
	}
	if m.obj != nil {
		for ; i < len(seqs); i++ {
			s, ok := m.obj.lookup(seqs[i])
			if !ok {
				break
			}
			m.obj.acquire(s)
			dst = append(dst, Staged{Tier: kv.TierExternal, slot: s, Meta: m.obj.slots[s].meta})
			m.st.MatchedObject++
		}
	}
	return dst
}

func (m *Manager) poolOf(t kv.Tier) *pool {
	switch t {
	case kv.TierHost:
		return m.host
	case kv.TierExternal:
		return m.obj
	}
	return m.disk
}

// Release unpins staged blocks that will not be onboarded.
func (m *Manager) Release(staged []Staged) {
	defer m.ev.flush()
	for _, b := range staged {
		m.poolOf(b.Tier).release(b.slot)
	}
}

// Onboard copies staged[i] into device block ids[i] and verifies each
// block's checksum over the bytes the copy read, in order, unpinning every
// staged block.
// It stops at the first block that fails: a corrupt one is dropped from
// its tier and counted; the rest are released unloaded. It returns how many
// leading blocks are valid on the device.
func (m *Manager) Onboard(dev Device, staged []Staged, ids []DeviceBlockID) (int, error) {
	defer m.ev.flush()
	if len(ids) != len(staged) {
		m.Release(staged)
		return 0, fmt.Errorf("kvbm: onboard %d blocks into %d device blocks", len(staged), len(ids))
	}
	n := 0
	var err error
	for i, b := range staged {
		p := m.poolOf(b.Tier)
		if err == nil {
			err = m.onboardOne(dev, p, b, ids[i])
			if err == nil {
				n++
			}
		}
		p.release(b.slot)
	}
	return n, err
}

func (m *Manager) onboardOne(dev Device, p *pool, b Staged, id DeviceBlockID) error {
	if p.slots[b.slot].state != slotRegistered {
		return fmt.Errorf("kvbm: block %016x left the %v tier before onboarding", uint64(b.Meta.Seq), b.Tier)
	}
	if pd, ok := dev.(PieceDevice); ok && !(p == m.obj && m.host != nil) {
		if v, isView := p.store.(Viewer); isView {
			// The device reads the slot (into cache), the check follows.
			verify := v.View(int(b.slot))
			if err := pd.WriteBlock(id, verify); err != nil {
				m.st.Errors++
				return fmt.Errorf("kvbm: onboard block %016x from %v: %w", uint64(b.Meta.Seq), b.Tier, err)
			}
			return m.verified(p, b, verify)
		}
	}
	dst, err := dev.WriteView(id)
	if err == nil && len(dst) != m.cfg.BlockBytes {
		err = fmt.Errorf("device block %d has %d bytes, want %d", id, len(dst), m.cfg.BlockBytes)
	}
	if err == nil && p == m.obj && m.host != nil {
		if ok, herr := m.viaHost(p, b, dst); herr != nil || ok {
			if herr != nil {
				var ce *CorruptError
				if !errors.As(herr, &ce) {
					m.st.Errors++
				}
				return herr
			}
			m.st.OnboardedObject++
			return nil
		}
	}
	// What is verified is what the copy read, as it is then in cache: a
	// host slot, copied to the device with streaming stores (the device's
	// block is not read again soon), or the bytes a disk read landed.
	verify := dst
	if err == nil {
		if v, isView := p.store.(Viewer); isView {
			verify = v.View(int(b.slot))
			streamcopy.Copy(dst, verify)
		} else {
			err = p.store.Get(int(b.slot), dst)
		}
	}
	if err != nil {
		m.st.Errors++
		return fmt.Errorf("kvbm: onboard block %016x from %v: %w", uint64(b.Meta.Seq), b.Tier, err)
	}
	return m.verified(p, b, verify)
}

// verified checks an onboarded block's bytes (verify) against its
// checksum and counts the onboard; a corrupt block is dropped from p.
func (m *Manager) verified(p *pool, b Staged, verify []byte) error {
	if got := kv.Checksum(verify); got != b.Meta.Sum {
		p.drop(b.slot)
		m.st.Corrupt++
		return &CorruptError{Tier: b.Tier, Seq: b.Meta.Seq, Got: got, Want: b.Meta.Sum}
	}
	switch p {
	case m.host:
		m.st.OnboardedHost++
	case m.disk:
		m.st.OnboardedDisk++
	default:
		m.st.OnboardedObject++
	}
	return nil
}

// viaHost onboards object block b through the host tier, as G4 is bounced
// through G2: read into a fresh host slot, verify there, register it (the
// block is a host block from now on) and copy it to the device view dst.
// ok is false when host has no slot to spare (the caller reads the object
// straight to the device) or already holds the block.
func (m *Manager) viaHost(p *pool, b Staged, dst []byte) (bool, error) {
	v, isView := m.host.store.(Viewer)
	if !isView {
		return false, nil
	}
	if _, ok := m.host.lookup(b.Meta.Seq); ok {
		return false, nil
	}
	s, ok := m.host.alloc()
	if !ok {
		return false, nil
	}
	buf := v.View(int(s))
	if err := p.store.Get(int(b.slot), buf); err != nil {
		m.host.release(s)
		return false, fmt.Errorf("kvbm: onboard block %016x from %v: %w", uint64(b.Meta.Seq), b.Tier, err)
	}
	if got := kv.Checksum(buf); got != b.Meta.Sum {
		m.host.release(s)
		p.drop(b.slot)
		m.st.Corrupt++
		return false, &CorruptError{Tier: b.Tier, Seq: b.Meta.Seq, Got: got, Want: b.Meta.Sum}
	}
	m.host.register(s, b.Meta)
	copy(dst, buf)
	return true, nil
}

// CorruptError is a block whose bytes failed verification.
type CorruptError struct {
	Tier      kv.Tier
	Seq       kv.SeqHash
	Got, Want uint64
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("kvbm: %v block %016x is corrupt: checksum %016x, want %016x", e.Tier, uint64(e.Seq), e.Got, e.Want)
}

// RecoverDisk rebuilds the disk tier's registry from its storage (a
// Scanner, such as a reopened DiskFile): every slot with an intact header
// is read back and its checksum verified; valid blocks become inactive
// disk blocks (with Stored events), corrupt ones and duplicates are left
// free. It returns the blocks recovered and dropped.
func (m *Manager) RecoverDisk() (recovered, corrupt int, err error) {
	if m.disk == nil {
		return 0, 0, errors.New("kvbm: no disk tier to recover")
	}
	recovered, corrupt, err = m.recover(m.disk)
	m.st.RecoveredDisk += uint64(recovered)
	return recovered, corrupt, err
}

// RecoverObject is RecoverDisk for the object tier (a Scanner such as a
// bucket listing): objects left by a previous run with the same prefix.
func (m *Manager) RecoverObject() (recovered, corrupt int, err error) {
	if m.obj == nil {
		return 0, 0, errors.New("kvbm: no object tier to recover")
	}
	recovered, corrupt, err = m.recover(m.obj)
	m.st.RecoveredObject += uint64(recovered)
	return recovered, corrupt, err
}

func (m *Manager) recover(p *pool) (recovered, corrupt int, err error) {
	defer m.ev.flush()
	sc, ok := p.store.(Scanner)
	if !ok {
		return 0, 0, fmt.Errorf("kvbm: the %v storage keeps no block headers", p.tier)
	}
	if p.len() > 0 {
		return 0, 0, fmt.Errorf("kvbm: recover into a %v tier that already holds blocks", p.tier)
	}
	buf := make([]byte, m.cfg.BlockBytes)
	var ioErr error
	serr := sc.Scan(func(slot int, meta BlockMeta) {
		if ioErr != nil {
			return
		}
		if _, dup := p.lookup(meta.Seq); dup {
			return
		}
		if e := p.store.Get(slot, buf); e != nil {
			ioErr = e
			return
		}
		if kv.Checksum(buf) != meta.Sum {
			corrupt++
			return
		}
		s := int32(slot)
		sl := &p.slots[s]
		sl.state, sl.ref = slotWriting, 1
		p.register(s, meta)
		recovered++
	})
	// Rebuild the free list without the recovered slots, slot 0 first.
	p.free = p.free[:0]
	for i := len(p.slots) - 1; i >= 0; i-- {
		if p.slots[i].state == slotFree {
			p.free = append(p.free, int32(i))
		}
	}
	m.st.Corrupt += uint64(corrupt)
	if serr != nil {
		return recovered, corrupt, serr
	}
	return recovered, corrupt, ioErr
}
