package kvbm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/kvmesh/kvmesh/internal/streamcopy"
	"github.com/kvmesh/kvmesh/kv"
)

// BlockMeta is what a tier keeps about one block besides its bytes.
type BlockMeta struct {
	Seq       kv.SeqHash
	Local     kv.LocalHash
	Parent    kv.SeqHash // the previous block's sequence hash, when HasParent
	HasParent bool
	Sum       uint64 // kv.Checksum of the block's bytes
	Priority  uint32 // retention priority: lower is evicted first
}

// Storage holds the bytes of one tier in fixed-size slots. A Manager owns
// its storages; they need not be safe for concurrent use.
type Storage interface {
	Slots() int
	BlockBytes() int
	// Put stores src (BlockBytes long) as slot's bytes. m is the block's
	// identity and checksum, for a storage that persists them.
	Put(slot int, src []byte, m BlockMeta) error
	// Get reads slot's bytes into dst (BlockBytes long).
	Get(slot int, dst []byte) error
}

// Viewer is a Storage whose slots are addressable memory: the manager
// reads a slot through View instead of copying it out first.
type Viewer interface {
	View(slot int) []byte
}

// Scanner is a Storage that persists block identities, so a restart can
// find its blocks again: Scan calls fn for every slot whose header is
// intact (the payload is not checked; the manager verifies it).
type Scanner interface {
	Scan(fn func(slot int, m BlockMeta)) error
}

// Sealer is a Storage that persists block identities yet can take a
// block's bytes before its checksum: the manager may Put with a zero Sum,
// then Seal the slot with the whole meta before the next Commit.
type Sealer interface {
	Seal(slot int, m BlockMeta)
}

// Committer is a Storage that batches part of its writes: the manager
// calls Commit at the end of every call that stored blocks.
type Committer interface {
	Commit() error
}

// AsyncPutter is a Storage whose writes are slow (a remote object store)
// and run elsewhere, behind a bounded queue: the manager hands a block to
// PutAsync instead of calling Put, and registers it only once Completed
// reports its write done and verified. Only the manager's goroutine calls
// these; the writes themselves run on the storage's own goroutines.
type AsyncPutter interface {
	// Full reports whether PutAsync would refuse a write now.
	Full() bool
	// PutAsync copies src into a staging buffer the queue owns (the
	// caller may reuse src at once) and queues its write as slot's bytes.
	// It returns false, having copied nothing, when the queue is full.
	PutAsync(slot int, src []byte, m BlockMeta) bool
	// Completed appends the writes finished since the last call.
	Completed(dst []PutResult) []PutResult
}

// PutResult is one finished PutAsync: Err is nil when the block was
// written and verified.
type PutResult struct {
	Slot int
	Meta BlockMeta
	Err  error
}

// HostArena is the host tier's storage: one byte arena in process memory,
// slot i at [i·BlockBytes, (i+1)·BlockBytes).
type HostArena struct {
	buf []byte
	bb  int
	n   int
}

// NewHostArena allocates slots blocks of blockBytes each.
func NewHostArena(slots, blockBytes int) (*HostArena, error) {
	if slots <= 0 || blockBytes <= 0 {
		return nil, fmt.Errorf("kvbm: host arena of %d slots × %d bytes", slots, blockBytes)
	}
	return &HostArena{buf: make([]byte, slots*blockBytes), bb: blockBytes, n: slots}, nil
}

// NewHostArenaOver is a host arena over memory the caller owns and keeps
// alive (kvmesh's engine connector maps it from a shared-memory file, so
// the engine's worker process can reach it); buf holds at least slots
// blocks of blockBytes.
func NewHostArenaOver(buf []byte, slots, blockBytes int) (*HostArena, error) {
	if slots <= 0 || blockBytes <= 0 || len(buf) < slots*blockBytes {
		return nil, fmt.Errorf("kvbm: host arena of %d slots × %d bytes over %d bytes", slots, blockBytes, len(buf))
	}
	return &HostArena{buf: buf[:slots*blockBytes], bb: blockBytes, n: slots}, nil
}

func (h *HostArena) Slots() int      { return h.n }
func (h *HostArena) BlockBytes() int { return h.bb }

// View returns slot's bytes, aliasing the arena.
func (h *HostArena) View(slot int) []byte {
	off := slot * h.bb
	return h.buf[off : off+h.bb : off+h.bb]
}

// Put copies src into slot with streaming stores: the arena is large and
// cold, and a block offloaded now is read back long after (if ever).
func (h *HostArena) Put(slot int, src []byte, _ BlockMeta) error {
	if err := checkSlot(slot, h.n, len(src), h.bb); err != nil {
		return err
	}
	streamcopy.Copy(h.View(slot), src)
	return nil
}

func (h *HostArena) Get(slot int, dst []byte) error {
	if err := checkSlot(slot, h.n, len(dst), h.bb); err != nil {
		return err
	}
	copy(dst, h.View(slot))
	return nil
}

func checkSlot(slot, slots, n, bb int) error {
	if slot < 0 || slot >= slots {
		return fmt.Errorf("kvbm: slot %d out of range [0, %d)", slot, slots)
	}
	if n != bb {
		return fmt.Errorf("kvbm: buffer of %d bytes for a %d-byte block", n, bb)
	}
	return nil
}

// Disk file layout: see the package doc.
const (
	diskMagic      = "KVMESHG3"
	diskVersion    = 2
	diskAlign      = 4096
	diskDataAlign  = 2 << 20
	diskHeaderSize = diskAlign
	slotHeaderSize = 64
	slotMagic      = 0x31425653 // "SVB1" little-endian
	flagHasParent  = 1
)

func alignUp(n, a int64) int64 { return (n + a - 1) / a * a }

// DiskFile is the disk tier's storage: one preallocated file of slots (see
// the package doc for the layout and the fsync policy).
type DiskFile struct {
	f       *os.File
	path    string
	bb      int
	n       int
	stride  int64
	dataOff int64
	// hdrs mirrors the slot headers; Put fills it and Commit writes the
	// dirty range [lo, hi) with one pwrite, after the payloads.
	hdrs   []byte
	lo, hi int
	// Reopened is true when OpenDiskFile found an existing pool file of the
	// same geometry: its slots may hold blocks to recover.
	Reopened bool
}

// OpenDiskFile opens the pool file at path for slots blocks of blockBytes
// each. An existing file with the same geometry is kept as it is (its
// blocks can be recovered); anything else at path is replaced by a fresh,
// empty pool file.
func OpenDiskFile(path string, slots, blockBytes int) (*DiskFile, error) {
	if slots <= 0 || blockBytes <= 0 {
		return nil, fmt.Errorf("kvbm: disk pool of %d slots × %d bytes", slots, blockBytes)
	}
	d := &DiskFile{path: path, bb: blockBytes, n: slots,
		stride: alignUp(int64(blockBytes), diskAlign), hdrs: make([]byte, slots*slotHeaderSize), lo: slots}
	// Payloads start on a 2 MiB boundary (the gap is sparse, never
	// written): with 4 KiB alignment alone the page cache cannot back a
	// block with large folios, and every pread/pwrite of it cost half as
	// much again as the same I/O on a plain file.
	d.dataOff = alignUp(diskHeaderSize+int64(slots)*slotHeaderSize, diskDataAlign)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("kvbm: disk pool: %w", err)
	}
	d.f = f
	want := d.fileHeader()
	got := make([]byte, diskHeaderSize)
	if _, err := f.ReadAt(got, 0); err == nil && string(got) == string(want) {
		if _, err := f.ReadAt(d.hdrs, diskHeaderSize); err != nil {
			f.Close()
			return nil, fmt.Errorf("kvbm: disk pool %s: slot headers: %w", path, err)
		}
		d.Reopened = true
		return d, nil
	} else if err != nil && !errors.Is(err, io.EOF) {
		f.Close()
		return nil, fmt.Errorf("kvbm: disk pool %s: %w", path, err)
	}
	// Fresh: drop old contents, size the file (sparse) and write the header.
	if err := f.Truncate(0); err == nil {
		err = f.Truncate(d.dataOff + int64(slots)*d.stride)
	}
	if err == nil {
		_, err = f.WriteAt(want, 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("kvbm: disk pool %s: %w", path, err)
	}
	return d, nil
}

func (d *DiskFile) fileHeader() []byte {
	b := make([]byte, diskHeaderSize)
	copy(b, diskMagic)
	binary.LittleEndian.PutUint32(b[8:], diskVersion)
	binary.LittleEndian.PutUint64(b[16:], uint64(d.bb))
	binary.LittleEndian.PutUint64(b[24:], uint64(d.n))
	binary.LittleEndian.PutUint64(b[32:], uint64(d.stride))
	binary.LittleEndian.PutUint64(b[40:], uint64(d.dataOff))
	binary.LittleEndian.PutUint64(b[48:], kv.Checksum(b[:48]))
	return b
}

func (d *DiskFile) Slots() int      { return d.n }
func (d *DiskFile) BlockBytes() int { return d.bb }

// Path is the pool file's path.
func (d *DiskFile) Path() string { return d.path }

// PayloadOffset is where slot's payload starts in the file.
func (d *DiskFile) PayloadOffset(slot int) int64 { return d.dataOff + int64(slot)*d.stride }

func (d *DiskFile) headerOffset(slot int) int64 {
	return diskHeaderSize + int64(slot)*slotHeaderSize
}

// Put writes the payload; the slot header that makes it recoverable is
// written by the next Commit.
func (d *DiskFile) Put(slot int, src []byte, m BlockMeta) error {
	if err := checkSlot(slot, d.n, len(src), d.bb); err != nil {
		return err
	}
	if _, err := d.f.WriteAt(src, d.PayloadOffset(slot)); err != nil {
		return fmt.Errorf("kvbm: disk slot %d: %w", slot, err)
	}
	d.Seal(slot, m)
	return nil
}

// Seal sets slot's header to m, written by the next Commit.
func (d *DiskFile) Seal(slot int, m BlockMeta) {
	encodeSlotHeader(d.hdrs[slot*slotHeaderSize:(slot+1)*slotHeaderSize], m, d.bb)
	d.lo, d.hi = min(d.lo, slot), max(d.hi, slot+1)
}

// Commit writes the slot headers Put changed since the last Commit, as one
// contiguous range.
func (d *DiskFile) Commit() error {
	if d.lo >= d.hi {
		return nil
	}
	lo, hi := d.lo, d.hi
	d.lo, d.hi = d.n, 0
	if _, err := d.f.WriteAt(d.hdrs[lo*slotHeaderSize:hi*slotHeaderSize], d.headerOffset(lo)); err != nil {
		return fmt.Errorf("kvbm: disk pool %s: slot headers: %w", d.path, err)
	}
	return nil
}

// Get reads slot's payload into dst.
func (d *DiskFile) Get(slot int, dst []byte) error {
	if err := checkSlot(slot, d.n, len(dst), d.bb); err != nil {
		return err
	}
	if _, err := d.f.ReadAt(dst, d.PayloadOffset(slot)); err != nil {
		return fmt.Errorf("kvbm: disk slot %d: %w", slot, err)
	}
	return nil
}

// Scan reports every slot whose header (as read at open, or written
// since) is intact.
func (d *DiskFile) Scan(fn func(slot int, m BlockMeta)) error {
	buf := d.hdrs
	for i := 0; i < d.n; i++ {
		if m, ok := decodeSlotHeader(buf[i*slotHeaderSize:(i+1)*slotHeaderSize], d.bb); ok {
			fn(i, m)
		}
	}
	return nil
}

// Sync commits pending headers and flushes the pool file to stable storage.
func (d *DiskFile) Sync() error {
	if err := d.Commit(); err != nil {
		return err
	}
	return d.f.Sync()
}

// Close commits, fsyncs and closes the pool file.
func (d *DiskFile) Close() error {
	err := d.Sync()
	if cerr := d.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// BlockHeaderSize is the length of a block header.
const BlockHeaderSize = slotHeaderSize

// EncodeBlockHeader writes the self-checking header of block m (its
// identity, payload checksum, priority and size) into b, BlockHeaderSize
// long: what the disk pool keeps per slot and an object-tier store
// prefixes each object with.
func EncodeBlockHeader(b []byte, m BlockMeta, blockBytes int) { encodeSlotHeader(b, m, blockBytes) }

// DecodeBlockHeader reads a header EncodeBlockHeader wrote for a
// blockBytes block; ok is false for anything else.
func DecodeBlockHeader(b []byte, blockBytes int) (m BlockMeta, ok bool) {
	if len(b) < BlockHeaderSize {
		return BlockMeta{}, false
	}
	return decodeSlotHeader(b, blockBytes)
}

func encodeSlotHeader(b []byte, m BlockMeta, bb int) {
	le := binary.LittleEndian
	le.PutUint32(b[0:], slotMagic)
	var flags uint32
	if m.HasParent {
		flags |= flagHasParent
	}
	le.PutUint32(b[4:], flags)
	le.PutUint64(b[8:], uint64(m.Seq))
	le.PutUint64(b[16:], uint64(m.Local))
	le.PutUint64(b[24:], uint64(m.Parent))
	le.PutUint64(b[32:], m.Sum)
	le.PutUint32(b[40:], m.Priority)
	le.PutUint32(b[44:], uint32(bb))
	le.PutUint64(b[48:], 0)
	le.PutUint64(b[56:], kv.Checksum(b[:56]))
}

func decodeSlotHeader(b []byte, bb int) (BlockMeta, bool) {
	le := binary.LittleEndian
	if le.Uint32(b[0:]) != slotMagic || le.Uint64(b[56:]) != kv.Checksum(b[:56]) || int(le.Uint32(b[44:])) != bb {
		return BlockMeta{}, false
	}
	return BlockMeta{
		HasParent: le.Uint32(b[4:])&flagHasParent != 0,
		Seq:       kv.SeqHash(le.Uint64(b[8:])),
		Local:     kv.LocalHash(le.Uint64(b[16:])),
		Parent:    kv.SeqHash(le.Uint64(b[24:])),
		Sum:       le.Uint64(b[32:]),
		Priority:  le.Uint32(b[40:]),
	}, true
}
