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
)

// The shared arena file (see the package doc):
//
//	[0, 64)       header: "KVMESHAR", then little-endian uint64s: version,
//	              block bytes, host slots, host offset, staging slots,
//	              staging offset
//	[4096, …)     the host tier's slots, block bytes each
//	[staging, …)  the staging slots the engine's worker copies through
const (
	arenaMagic   = "KVMESHAR"
	arenaVersion = 1
	arenaDataOff = 4096
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
}

func createArena(dir, name string, blockBytes, hostSlots, staging int) (*arena, error) {
	if blockBytes <= 0 || hostSlots < 0 || staging <= 0 {
		return nil, fmt.Errorf("arena of %d host and %d staging slots × %d bytes", hostSlots, staging, blockBytes)
	}
	stagingOff := arenaDataOff + hostSlots*blockBytes
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
	copy(mem, arenaMagic)
	for i, v := range []int{arenaVersion, blockBytes, hostSlots, arenaDataOff, staging, stagingOff} {
		binary.LittleEndian.PutUint64(mem[8+8*i:], uint64(v))
	}
	return &arena{path: path, mem: mem, bb: blockBytes, hostSlots: hostSlots, staging: staging, stagingOff: stagingOff}, nil
}

// host is the host tier's part of the mapping.
func (a *arena) host() []byte { return a.mem[arenaDataOff:a.stagingOff] }

// stagingSlot is staging slot i's bytes.
func (a *arena) stagingSlot(i int) []byte {
	off := a.stagingOff + i*a.bb
	return a.mem[off : off+a.bb : off+a.bb]
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
