"""Moving KV blocks between the engine's tensors and the shared arena.

A device block's bytes, as the sidecar stores them, are the block's slice
of every registered KV tensor, in registration order, each in its own
memory order. The copy code is written against a small tensor interface
(``Ops``): ``NumpyOps`` drives it in tests with numpy arrays standing in
for device tensors, ``TorchOps`` with the engine's torch tensors (gathered
with ``index_select`` on the device, copied into a view of the mapping).
Both are imported lazily.
"""

import mmap
import os
import struct

_ARENA_HEADER = struct.Struct("<8s6Q")


class Arena:
    """The sidecar's shared arena file, mapped read-write. Only the staging
    slots are touched here; the host tier's slots belong to the sidecar."""

    def __init__(self, path):
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            self.mem = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        magic, version, bb, host, host_off, staging, staging_off = _ARENA_HEADER.unpack_from(self.mem, 0)
        if magic != b"KVMESHAR" or version != 1:
            self.mem.close()
            raise ValueError("%s is not a kvmesh arena (magic %r, version %d)" % (path, magic, version))
        if staging_off + staging * bb > size:
            self.mem.close()
            raise ValueError("%s: %d staging slots of %d bytes past its %d bytes" % (path, staging, bb, size))
        self.path, self.block_bytes, self.staging_slots, self.staging_offset = path, bb, staging, staging_off

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
        self.views, self.spans = [], []
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
            self.spans.append((off, off + n))
            off += n
        self.block_bytes, self.num_blocks = off, nblocks
        self.staged = None

    def attach(self, arena):
        if arena.block_bytes != self.block_bytes:
            raise ValueError("arena of %d-byte blocks for %d-byte device blocks" % (arena.block_bytes, self.block_bytes))
        rows = self.ops.staging(arena)
        # Each tensor's columns of the staging slots, typed like it.
        self.staged = [self.ops.typed(rows[:, lo:hi], v) for v, (lo, hi) in zip(self.views, self.spans)]

    def save(self, device_ids, slots):
        """Device blocks → staging slots."""
        ids, slots = [int(i) for i in device_ids], [int(s) for s in slots]
        for v, st in zip(self.views, self.staged):
            self.ops.save_blocks(v, ids, st, slots)
        self.ops.synchronize()

    def load(self, device_ids, slots):
        """Staging slots → device blocks."""
        ids, slots = [int(i) for i in device_ids], [int(s) for s in slots]
        for v, st in zip(self.views, self.staged):
            self.ops.load_blocks(v, ids, st, slots)
        self.ops.synchronize()
