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

    def index(self, ids, like=None):
        return self.np.asarray(ids, dtype=self.np.int64)

    def blocks_first(self, t, axis):
        return self.np.moveaxis(t, axis, 0)

    def nbytes_per_block(self, t):
        return t.nbytes // t.shape[0]

    def gather_bytes(self, t, idx):
        """Blocks idx of t (block axis first) as a (k, bytes) uint8 matrix."""
        chunk = self.np.ascontiguousarray(t[idx])
        return chunk.reshape(len(idx), -1).view(self.np.uint8)

    def put_rows(self, staging, slots, lo, hi, rows):
        staging[slots, lo:hi] = rows

    def take_rows(self, staging, slots, lo, hi):
        return staging[slots, lo:hi]

    def scatter_bytes(self, t, idx, rows):
        """Writes the (k, bytes) matrix rows into blocks idx of t."""
        k = len(idx)
        t[idx] = self.np.ascontiguousarray(rows).view(t.dtype).reshape((k,) + t.shape[1:])

    def synchronize(self):
        pass


class TorchOps:
    """The tensor interface over torch tensors (any device): gathers on the
    device, one copy across into the mapping, and back."""

    def __init__(self):
        import torch

        self.torch = torch

    def staging(self, arena):
        t = self.torch.frombuffer(arena.mem, dtype=self.torch.uint8, count=arena.staging_slots * arena.block_bytes,
                                  offset=arena.staging_offset)
        return t.view(arena.staging_slots, arena.block_bytes)

    def index(self, ids, like=None):
        dev = like.device if like is not None else "cpu"
        return self.torch.as_tensor(ids, dtype=self.torch.long, device=dev)

    def blocks_first(self, t, axis):
        return t.movedim(axis, 0)

    def nbytes_per_block(self, t):
        return t.numel() * t.element_size() // t.shape[0]

    def gather_bytes(self, t, idx):
        chunk = t.index_select(0, idx).contiguous()
        return chunk.view(self.torch.uint8).reshape(len(idx), -1).cpu()

    def put_rows(self, staging, slots, lo, hi, rows):
        staging[slots.cpu(), lo:hi] = rows

    def take_rows(self, staging, slots, lo, hi):
        return staging[slots.cpu(), lo:hi]

    def scatter_bytes(self, t, idx, rows):
        k = len(idx)
        src = rows.to(t.device, non_blocking=True).contiguous().view(t.dtype).reshape((k,) + tuple(t.shape[1:]))
        t.index_copy_(0, idx, src)

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
        self.staging = None

    def attach(self, arena):
        if arena.block_bytes != self.block_bytes:
            raise ValueError("arena of %d-byte blocks for %d-byte device blocks" % (arena.block_bytes, self.block_bytes))
        self.staging = self.ops.staging(arena)

    def save(self, device_ids, slots):
        """Device blocks → staging slots."""
        if not device_ids:
            return
        sl = self.ops.index(slots)
        for v, (lo, hi) in zip(self.views, self.spans):
            self.ops.put_rows(self.staging, sl, lo, hi, self.ops.gather_bytes(v, self.ops.index(device_ids, v)))

    def load(self, device_ids, slots):
        """Staging slots → device blocks."""
        if not device_ids:
            return
        sl = self.ops.index(slots)
        for v, (lo, hi) in zip(self.views, self.spans):
            self.ops.scatter_bytes(v, self.ops.index(device_ids, v), self.ops.take_rows(self.staging, sl, lo, hi))
        self.ops.synchronize()
