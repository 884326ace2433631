package sidecar

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/kvmesh/kvmesh/internal/streamcopy"
	"github.com/kvmesh/kvmesh/kv"
)

// The shared arena file (see the package doc):
//
//	[0, 64)       header: "KVMESHAR", then little-endian uint64s: version,
//	              block bytes, host slots, host offset, staging slots,
//	              staging offset, and (version 2) the number of pieces N
//	[64, 64+8N)   version 2: each piece's bytes
//	[4096, …)     the host tier's slots, block bytes each
//	[staging, …)  the staging slots the engine's worker copies through
//
// Version 1 lays the staging slots block by block, each a whole block.
// Version 2, for a worker that registers how its block's bytes split into
// pieces (each a contiguous run of one of its KV tensors, such as a
// layer's K or V of one block: the block is the pieces concatenated), lays
// them piece by piece: piece j of slot s at staging + slots·(bytes of the
// pieces before j) + s·(piece j's bytes). A step's blocks in consecutive
// slots then have each piece in one contiguous run of the arena: the
// worker fills it with one gather (or, for consecutive device blocks, one
// contiguous copy) per piece instead of a copy per block and piece. The
// host tier's slots hold whole blocks in either version (the tiers,
// checksums and recovery do not see the staging layout). The staging
// offset sits align bytes past a page boundary: the worker asks for half a
// page from its tensors' own page offset, to the byte, because copies
// between addresses a few bytes apart modulo 4 KiB run at about half speed
// on x86 (4K aliasing), and ones whose source and destination sit at
// different offsets in their cache lines lose another tenth
// (docs/benchmarks.md §8).
const (
	arenaMagic   = "KVMESHAR"
	arenaVersion = 1
	// arenaVersionPieces is the piece-by-piece staging layout.
	arenaVersionPieces = 2
	arenaDataOff       = 4096
	arenaPage          = 4096
	// maxPieces is what the header's page holds.
	maxPieces = (arenaDataOff - 64) / 8
	// DefaultStagingAlign is the staging offset's distance past a page
	// boundary when the worker asks for none: half a page, away from the
	// small offsets allocators give large arrays.
	DefaultStagingAlign = 2048
)

// arena is the shared-memory file the sidecar creates and owns: mode 0600,
// created exclusively (a file left by someone else is never reused), mapped
// shared, unlinked at close.
type arena struct {
	path               string
	mem                []byte
	bb                 int
	hostSlots, staging int
	stagingOff         int
	// pieces is each piece's bytes of a block, staged piece by piece
	// (version 2); nil stages whole blocks. pieceOff[j] is piece j's
	// first staging byte.
	pieces, pieceOff []int
}

// validLayout checks a registration's pieces (nil or empty: whole blocks)
// and staging alignment against bb-byte blocks.
func validLayout(bb int, pieces []int, align int) error {
	if align < 0 || align >= arenaPage {
		return fmt.Errorf("staging_align %d, want [0, %d)", align, arenaPage)
	}
	if len(pieces) == 0 {
		return nil
	}
	if len(pieces) > maxPieces {
		return fmt.Errorf("%d pieces, at most %d", len(pieces), maxPieces)
	}
	sum := 0
	for _, n := range pieces {
		if n <= 0 {
			return fmt.Errorf("piece_bytes %v: each must be > 0", pieces)
		}
		sum += n
	}
	if sum != bb {
		return fmt.Errorf("piece_bytes sum to %d, block_bytes is %d", sum, bb)
	}
	return nil
}

func createArena(dir, name string, blockBytes, hostSlots, staging int, pieces []int, align int) (*arena, error) {
	if blockBytes <= 0 || hostSlots < 0 || staging <= 0 {
		return nil, fmt.Errorf("arena of %d host and %d staging slots × %d bytes", hostSlots, staging, blockBytes)
	}
	if err := validLayout(blockBytes, pieces, align); err != nil {
		return nil, err
	}
	hostEnd := arenaDataOff + hostSlots*blockBytes
	stagingOff := (hostEnd+arenaPage-1)/arenaPage*arenaPage + align
	size := stagingOff + staging*blockBytes
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close() // the mapping outlives the descriptor
	fail := func(err error) (*arena, error) {
		os.Remove(path)
		return nil, err
	}
	if err := f.Truncate(int64(size)); err != nil {
		return fail(err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return fail(fmt.Errorf("mmap %s: %w", path, err))
	}
	a := &arena{path: path, mem: mem, bb: blockBytes, hostSlots: hostSlots, staging: staging, stagingOff: stagingOff}
	version := arenaVersion
	if len(pieces) > 0 {
		version = arenaVersionPieces
		a.pieces = append([]int(nil), pieces...)
		off := stagingOff
		for _, n := range pieces {
			a.pieceOff = append(a.pieceOff, off)
			off += staging * n
		}
	}
	copy(mem, arenaMagic)
	for i, v := range []int{version, blockBytes, hostSlots, arenaDataOff, staging, stagingOff} {
		binary.LittleEndian.PutUint64(mem[8+8*i:], uint64(v))
	}
	if version == arenaVersionPieces {
		binary.LittleEndian.PutUint64(mem[56:], uint64(len(pieces)))
		for i, n := range pieces {
			binary.LittleEndian.PutUint64(mem[64+8*i:], uint64(n))
		}
	}
	return a, nil
}

// host is the host tier's part of the mapping.
func (a *arena) host() []byte { return a.mem[arenaDataOff:a.stagingOff] }

// stagingSlot is staging slot i's bytes (whole-block staging only).
func (a *arena) stagingSlot(i int) []byte {
	off := a.stagingOff + i*a.bb
	return a.mem[off : off+a.bb : off+a.bb]
}

// readSlot copies staging slot i's block into dst (bb bytes), piece by
// piece.
func (a *arena) readSlot(i int, dst []byte) {
	for j, n := range a.pieces {
		off := a.pieceOff[j] + i*n
		dst = dst[copy(dst, a.mem[off:off+n]):]
	}
}

// readSlotHashed copies staging slot i's block into dst (bb bytes, a host
// tier slot: streaming stores) piece by piece and returns its kv.Checksum,
// each piece hashed right after its copy read it into cache.
func (a *arena) readSlotHashed(i int, dst []byte) uint64 {
	h := kv.NewChecksum()
	for j, n := range a.pieces {
		off := a.pieceOff[j] + i*n
		piece := a.mem[off : off+n]
		dst = dst[streamcopy.Copy(dst, piece):]
		h.Write(piece)
	}
	return h.Sum64()
}

// writeSlot copies a block (bb bytes) into staging slot i, piece by
// piece, with streaming stores (the engine's worker reads the slot; this
// process does not).
func (a *arena) writeSlot(i int, src []byte) {
	for j, n := range a.pieces {
		off := a.pieceOff[j] + i*n
		src = src[streamcopy.Copy(a.mem[off:off+n], src):]
	}
}

func (a *arena) close() error {
	if a == nil || a.mem == nil {
		return nil
	}
	err := syscall.Munmap(a.mem)
	a.mem = nil
	if rerr := os.Remove(a.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	return err
}

// removeStaleArenas removes the arena files of earlier sidecars of this
// name (name-PID.arena) whose process is gone: a killed sidecar cannot
// remove its own, and shared memory is not freed until someone does.
func removeStaleArenas(dir, name string, log *slog.Logger) {
	paths, _ := filepath.Glob(filepath.Join(dir, name+"-*.arena"))
	for _, p := range paths {
		pid, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), name+"-"), ".arena"))
		if err != nil || pid <= 0 || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		if err := os.Remove(p); err == nil {
			log.Info("kvbm sidecar: removed a dead sidecar's arena", "path", p)
		}
	}
}
