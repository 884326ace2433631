"""Moving KV blocks between the engine's tensors and the shared arena.

A device block's bytes, as the sidecar stores them, are the block's slice
of every registered KV tensor, in registration order, each in its own
memory order. The staging slots the worker copies through are laid out
either block by block (arena version 1: each slot a whole block) or, when
the worker registered its tensors, tensor by tensor (version 2): tensor
i's pieces of all slots side by side, so a step's blocks of one tensor are
one gather (``take`` / ``index_select``) out of the tensor into one
contiguous run of the arena, and one scatter back, instead of a copy per
block (docs/benchmarks.md §8). The copy code is written against a small
tensor interface (``Ops``): ``NumpyOps`` drives it in tests with numpy
arrays standing in for device tensors, ``TorchOps`` with the engine's
torch tensors (gathered with ``index_select`` on the device, copied into a
view of the mapping). Both are imported lazily.
"""

import mmap
import os
import struct

_ARENA_HEADER = struct.Struct("<8s6Q")
_PAGE = 4096


class Arena:
    """The sidecar's shared arena file, mapped read-write. Only the staging
    slots are touched here; the host tier's slots belong to the sidecar.
    ``tensor_bytes`` is None for whole-block staging (version 1), else each
    tensor's bytes of a block, staged tensor by tensor (version 2)."""

    def __init__(self, path):
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            self.mem = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        magic, version, bb, host, host_off, staging, staging_off = _ARENA_HEADER.unpack_from(self.mem, 0)
        tensor_bytes = None
        try:
            if magic != b"KVMESHAR" or version not in (1, 2):
                raise ValueError("%s is not a kvmesh arena (magic %r, version %d)" % (path, magic, version))
            if staging_off + staging * bb > size:
                raise ValueError("%s: %d staging slots of %d bytes past its %d bytes" % (path, staging, bb, size))
            if version == 2:
                (n,) = struct.unpack_from("<Q", self.mem, 56)
                if not 0 < n <= (_PAGE - 64) // 8:
                    raise ValueError("%s: %d tensors" % (path, n))
                tensor_bytes = list(struct.unpack_from("<%dQ" % n, self.mem, 64))
                if sum(tensor_bytes) != bb or min(tensor_bytes) <= 0:
                    raise ValueError("%s: tensors of %s bytes for %d-byte blocks" % (path, tensor_bytes, bb))
        except ValueError:
            self.mem.close()
            raise
        self.path, self.block_bytes, self.staging_slots, self.staging_offset = path, bb, staging, staging_off
        self.tensor_bytes = tensor_bytes

    def tensor_offsets(self):
        """Where each tensor's staging pieces start (version 2)."""
        offs, off = [], self.staging_offset
        for n in self.tensor_bytes:
            offs.append(off)
            off += self.staging_slots * n
        return offs

    def close(self):
        try:
            self.mem.close()
        except BufferError:
            pass  # views still alive: the mapping goes with them


def _runs(device_ids, slots):
    """Splits the pairs into runs of consecutive staging slots."""
    i, n = 0, len(slots)
    while i < n:
        j = i + 1
        while j < n and slots[j] == slots[j - 1] + 1:
            j += 1
        yield device_ids[i:j], slots[i], j - i
        i = j


def _spans(device_ids, slots):
    """Splits the pairs into (first block, first slot, length) runs where
    both the device blocks and the slots are consecutive: each run is one
    strided copy instead of one per block."""
    i, n = 0, len(slots)
    while i < n:
        j = i + 1
        while j < n and slots[j] == slots[j - 1] + 1 and device_ids[j] == device_ids[j - 1] + 1:
            j += 1
        yield device_ids[i], slots[i], j - i
        i = j


class NumpyOps:
    """The tensor interface over numpy arrays."""

    def __init__(self):
        import numpy as np

        self.np = np

    def staging(self, arena):
        """The staging slots as a (slots, block bytes) uint8 matrix aliasing the mapping."""
        buf = self.np.frombuffer(arena.mem, dtype=self.np.uint8, count=arena.staging_slots * arena.block_bytes,
                                 offset=arena.staging_offset)
        return buf.reshape(arena.staging_slots, arena.block_bytes)

    def blocks_first(self, t, axis):
        return self.np.moveaxis(t, axis, 0)

    def nbytes_per_block(self, t):
        return t.nbytes // t.shape[0]

    def typed(self, rows, t):
        """rows, (slots, bytes) columns of the arena, seen as slots blocks
        of t, without a copy."""
        v = rows.view(t.dtype)
        v.shape = (rows.shape[0],) + t.shape[1:]  # raises rather than copy
        return v

    # One strided copy per run of consecutive blocks and slots runs at
    # memcpy speed, where numpy's take or fancy indexing over the same
    # views is several times slower (docs/benchmarks.md §8). Runs rather
    # than single blocks: each copyto has a fixed Python and numpy setup
    # cost, which a run pays once.

    def save_blocks(self, t, ids, staged, slots):
        """Blocks ids of t (block axis first) into staging slots."""
        cp = self.np.copyto
        for b, s, k in _spans(ids, slots):
            cp(staged[s:s + k], t[b:b + k])

    def load_blocks(self, t, ids, staged, slots):
        """Staging slots into blocks ids of t."""
        cp = self.np.copyto
        for b, s, k in _spans(ids, slots):
            cp(t[b:b + k], staged[s:s + k])

    # Tensor-by-tensor staging: a tensor is seen as byte rows (P·B, X),
    # block b's bytes being rows b, B+b, …, (P-1)·B+b; one take (mode
    # "clip": "raise" copies the output first) gathers a step's blocks into
    # the contiguous run of their slots, one fancy-index assignment
    # scatters them back. Each is one C loop of memmoves.

    def grouped(self, t, axis):
        """t's byte rows (P·B, X) without a copy, and P; None if t is not
        contiguous."""
        np = self.np
        if not t.flags.c_contiguous or t.ndim == 0:
            return None
        p = 1
        for d in t.shape[:axis]:
            p *= d
        return t.reshape(-1).view(np.uint8).reshape(p * t.shape[axis], -1), p

    def region(self, arena, offset, slots, nbytes):
        """slots × nbytes of the mapping from offset, as a uint8 matrix."""
        return self.np.frombuffer(arena.mem, dtype=self.np.uint8, count=slots * nbytes, offset=offset).reshape(slots, nbytes)

    def rows_index(self, ids, p, nblocks):
        ids = self.np.asarray(ids, dtype=self.np.intp)
        return (ids[:, None] + self.np.arange(0, p * nblocks, nblocks, dtype=self.np.intp)).reshape(-1)

    def gather(self, rows, idx, out):
        self.np.take(rows, idx, axis=0, out=out, mode="clip")

    def scatter(self, rows, idx, src):
        rows[idx] = src

    def page_offset(self, t):
        return t.ctypes.data % _PAGE

    def synchronize(self):
        pass


class TorchOps:
    """The tensor interface over torch tensors (any device): gathers with
    index_select on the device, one copy across into the mapping per run
    of consecutive slots, and back with index_copy_."""

    def __init__(self):
        import torch

        self.torch = torch

    def staging(self, arena):
        t = self.torch.frombuffer(arena.mem, dtype=self.torch.uint8, count=arena.staging_slots * arena.block_bytes,
                                  offset=arena.staging_offset)
        return t.view(arena.staging_slots, arena.block_bytes)

    def blocks_first(self, t, axis):
        return t.movedim(axis, 0)

    def nbytes_per_block(self, t):
        return t.numel() * t.element_size() // t.shape[0]

    def typed(self, rows, t):
        return rows.view(t.dtype).view((rows.shape[0],) + tuple(t.shape[1:]))

    def _index(self, ids, t):
        return self.torch.as_tensor(ids, dtype=self.torch.long, device=t.device)

    def save_blocks(self, t, ids, staged, slots):
        for run, s0, k in _runs(list(ids), list(slots)):
            staged[s0:s0 + k].copy_(t.index_select(0, self._index(run, t)))

    def load_blocks(self, t, ids, staged, slots):
        for run, s0, k in _runs(list(ids), list(slots)):
            t.index_copy_(0, self._index(run, t), staged[s0:s0 + k].to(t.device, non_blocking=True))

    def grouped(self, t, axis):
        if not t.is_contiguous() or t.dim() == 0:
            return None
        p = 1
        for d in t.shape[:axis]:
            p *= d
        return t.reshape(-1).view(self.torch.uint8).view(p * t.shape[axis], -1), p

    def region(self, arena, offset, slots, nbytes):
        t = self.torch.frombuffer(arena.mem, dtype=self.torch.uint8, count=slots * nbytes, offset=offset)
        return t.view(slots, nbytes)

    def rows_index(self, ids, p, nblocks):
        ids = self.torch.as_tensor(ids, dtype=self.torch.long)
        return (ids[:, None] + self.torch.arange(0, p * nblocks, nblocks, dtype=self.torch.long)).reshape(-1)

    def gather(self, rows, idx, out):
        out.copy_(rows.index_select(0, idx.to(rows.device)))

    def scatter(self, rows, idx, src):
        rows.index_copy_(0, idx.to(rows.device), src.to(rows.device, non_blocking=True))

    def page_offset(self, t):
        if t.device.type != "cpu":
            return None  # device memory: the arena's page offset does not matter
        return t.data_ptr() % _PAGE

    def synchronize(self):
        if self.torch.cuda.is_available():
            self.torch.cuda.synchronize()


def ops_for(tensor):
    """NumpyOps for a numpy array, TorchOps otherwise."""
    if type(tensor).__module__.startswith("numpy"):
        return NumpyOps()
    return TorchOps()


class BlockCopier:
    """Copies whole device blocks between registered KV tensors and the
    arena's staging slots.

    ``tensors`` is a list of (tensor, block_axis): each tensor holds every
    device block along block_axis (vLLM's per-layer (2, blocks, ...) caches
    have it at 1, TensorRT-LLM's one pool at 0).
    """

    def __init__(self, tensors, ops=None):
        if not tensors:
            raise ValueError("no KV tensors to register")
        self.ops = ops or ops_for(tensors[0][0])
        self.tensors = [t for t, _ in tensors]
        self.views, self.spans, self.grouped, self.tensor_bytes = [], [], [], []
        off = 0
        nblocks = None
        for t, axis in tensors:
            v = self.ops.blocks_first(t, axis)
            if nblocks is None:
                nblocks = v.shape[0]
            elif v.shape[0] != nblocks:
                raise ValueError("KV tensors of %d and %d blocks" % (nblocks, v.shape[0]))
            n = self.ops.nbytes_per_block(v)
            self.views.append(v)
            self.grouped.append(self.ops.grouped(t, axis))
            self.spans.append((off, off + n))
            self.tensor_bytes.append(n)
            off += n
        self.block_bytes, self.num_blocks = off, nblocks
        self.staged = None
        self.plan = None

    def staging_align(self):
        """The staging offset's distance past a page boundary to ask the
        sidecar for: half a page from the first tensor's own page offset
        (copies between addresses a few bytes apart modulo 4 KiB run at
        half speed), None for device memory."""
        po = self.ops.page_offset(self.tensors[0])
        if po is None:
            return None
        return (po + _PAGE // 2) % _PAGE // 64 * 64

    def attach(self, arena):
        if arena.block_bytes != self.block_bytes:
            raise ValueError("arena of %d-byte blocks for %d-byte device blocks" % (arena.block_bytes, self.block_bytes))
        if arena.tensor_bytes is None:
            rows = self.ops.staging(arena)
            # Each tensor's columns of the staging slots, typed like it.
            self.staged = [self.ops.typed(rows[:, lo:hi], v) for v, (lo, hi) in zip(self.views, self.spans)]
            self.plan = None
            return
        if arena.tensor_bytes != self.tensor_bytes:
            raise ValueError("arena staged for tensors of %s bytes, these have %s" % (arena.tensor_bytes, self.tensor_bytes))
        # Per tensor: (byte rows, P, its slots as (slots, P, X)) for one
        # gather per run of slots, or (None, view, its slots typed like
        # it) for a tensor that is not contiguous (a copy per block run).
        self.plan = []
        for v, g, n, off in zip(self.views, self.grouped, self.tensor_bytes, arena.tensor_offsets()):
            reg = self.ops.region(arena, off, arena.staging_slots, n)
            if g is None:
                self.plan.append((None, v, self.ops.typed(reg, v)))
            else:
                rows, p = g
                self.plan.append((rows, p, reg.reshape(arena.staging_slots, p, n // p)))
        self.staged = None

    def _check(self, ids):
        for i in ids:
            if not 0 <= i < self.num_blocks:
                raise IndexError("device block %d of %d" % (i, self.num_blocks))

    def save(self, device_ids, slots):
        """Device blocks → staging slots."""
        ids, slots = [int(i) for i in device_ids], [int(s) for s in slots]
        self._check(ids)
        if self.plan is None:
            for v, st in zip(self.views, self.staged):
                self.ops.save_blocks(v, ids, st, slots)
        else:
            self._move(ids, slots, True)
        self.ops.synchronize()

    def load(self, device_ids, slots):
        """Staging slots → device blocks."""
        ids, slots = [int(i) for i in device_ids], [int(s) for s in slots]
        self._check(ids)
        if self.plan is None:
            for v, st in zip(self.views, self.staged):
                self.ops.load_blocks(v, ids, st, slots)
        else:
            self._move(ids, slots, False)
        self.ops.synchronize()

    def _move(self, ids, slots, save):
        ops = self.ops
        for run, s0, k in _runs(ids, slots):
            idx = {}
            for rows, p, reg in self.plan:
                if rows is None:  # p is the tensor's blocks-first view
                    (ops.save_blocks if save else ops.load_blocks)(p, run, reg, list(range(s0, s0 + k)))
                    continue
                if p not in idx:
                    idx[p] = ops.rows_index(run, p, self.num_blocks)
                part = reg[s0:s0 + k]
                if save:
                    ops.gather(rows, idx[p], part.reshape(k * p, -1))
                else:
                    ops.scatter(rows, idx[p], part.reshape(k * p, -1))
