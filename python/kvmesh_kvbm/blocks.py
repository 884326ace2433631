"""Moving KV blocks between the engine's tensors and the shared arena.

A device block's bytes, as the sidecar stores them, are the block's slice
of every registered KV tensor, in registration order, each in its own
memory order. The staging slots the worker copies through are laid out
either block by block (arena version 1: each slot a whole block) or, when
the worker registered its pieces, piece by piece (version 2). A piece is
a contiguous run of one tensor in one block (vLLM's layer tensor
(2, blocks, ...) has two per block, K and V; TensorRT-LLM's pool
(blocks, ...) one): piece j of every slot sits side by side, so a step's
blocks of one piece are one gather (``take`` / ``index_select``) out of
the tensor into one contiguous run of the arena and one scatter back, or,
for consecutive device blocks, one contiguous copy each way, instead of a
copy per block (docs/benchmarks.md §8). The copy code is written against a
small tensor interface (``Ops``): ``NumpyOps`` drives it in tests with
numpy arrays standing in for device tensors, ``TorchOps`` with the
engine's torch tensors (gathered with ``index_select`` on the device,
copied into a view of the mapping). Both are imported lazily.
"""

import mmap
import os
import struct

_ARENA_HEADER = struct.Struct("<8s6Q")
_PAGE = 4096
MAX_PIECES = (_PAGE - 64) // 8  # what the arena header's page holds


class Arena:
    """The sidecar's shared arena file, mapped read-write. Only the staging
    slots are touched here; the host tier's slots belong to the sidecar.
    ``piece_bytes`` is None for whole-block staging (version 1), else each
    piece's bytes of a block, staged piece by piece (version 2)."""

    def __init__(self, path):
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            self.mem = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        magic, version, bb, host, host_off, staging, staging_off = _ARENA_HEADER.unpack_from(self.mem, 0)
        piece_bytes = None
        try:
            if magic != b"KVMESHAR" or version not in (1, 2):
                raise ValueError("%s is not a kvmesh arena (magic %r, version %d)" % (path, magic, version))
            if staging_off + staging * bb > size:
                raise ValueError("%s: %d staging slots of %d bytes past its %d bytes" % (path, staging, bb, size))
            if version == 2:
                (n,) = struct.unpack_from("<Q", self.mem, 56)
                if not 0 < n <= MAX_PIECES:
                    raise ValueError("%s: %d pieces" % (path, n))
                piece_bytes = list(struct.unpack_from("<%dQ" % n, self.mem, 64))
                if sum(piece_bytes) != bb or min(piece_bytes) <= 0:
                    raise ValueError("%s: pieces of %s bytes for %d-byte blocks" % (path, piece_bytes, bb))
        except ValueError:
            self.mem.close()
            raise
        self.path, self.block_bytes, self.staging_slots, self.staging_offset = path, bb, staging, staging_off
        self.piece_bytes = piece_bytes

    def piece_offsets(self):
        """Where each piece's staging run starts (version 2)."""
        offs, off = [], self.staging_offset
        for n in self.piece_bytes:
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

    # Piece-by-piece staging: a tensor is seen as bytes (P, B, X), block
    # b's pieces being [:, b]; one take per piece (mode "clip": "raise"
    # copies the output first) gathers a step's blocks into the contiguous
    # run of their slots, one fancy-index assignment scatters them back:
    # each one C loop of memmoves.

    def grouped(self, t, axis):
        """t as bytes (P, B, X) without a copy; None if t is not contiguous."""
        if not t.flags.c_contiguous or t.ndim == 0:
            return None
        p = 1
        for d in t.shape[:axis]:
            p *= d
        return t.reshape(-1).view(self.np.uint8).reshape(p, t.shape[axis], -1)

    def region(self, arena, offset, rows, nbytes):
        """rows × nbytes of the mapping from offset, as a uint8 matrix."""
        return self.np.frombuffer(arena.mem, dtype=self.np.uint8, count=rows * nbytes, offset=offset).reshape(rows, nbytes)

    def index(self, ids):
        return self.np.asarray(ids, dtype=self.np.intp)

    def gather(self, t3, idx, out3):
        """t3[:, idx] → out3 (P, k, X), each out3[p] contiguous."""
        take = self.np.take
        for p in range(t3.shape[0]):
            take(t3[p], idx, axis=0, out=out3[p], mode="clip")

    def scatter(self, t3, idx, src3):
        for p in range(t3.shape[0]):
            t3[p][idx] = src3[p]

    def copy(self, dst, src):
        self.np.copyto(dst, src)

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
        return t.reshape(-1).view(self.torch.uint8).view(p, t.shape[axis], -1)

    def region(self, arena, offset, rows, nbytes):
        t = self.torch.frombuffer(arena.mem, dtype=self.torch.uint8, count=rows * nbytes, offset=offset)
        return t.view(rows, nbytes)

    def index(self, ids):
        return self.torch.as_tensor(ids, dtype=self.torch.long)

    def gather(self, t3, idx, out3):
        out3.copy_(t3.index_select(1, idx.to(t3.device)))

    def scatter(self, t3, idx, src3):
        t3.index_copy_(1, idx.to(t3.device), src3.to(t3.device, non_blocking=True))

    def copy(self, dst, src):
        dst.copy_(src)

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
        self.views, self.spans, self.grouped, self.pieces = [], [], [], []
        off = 0
        nblocks = None
        for t, axis in tensors:
            v = self.ops.blocks_first(t, axis)
            if nblocks is None:
                nblocks = v.shape[0]
            elif v.shape[0] != nblocks:
                raise ValueError("KV tensors of %d and %d blocks" % (nblocks, v.shape[0]))
            n = self.ops.nbytes_per_block(v)
            g = self.ops.grouped(t, axis)
            self.views.append(v)
            self.grouped.append(g)
            # A tensor that is not contiguous is one piece, copied run by run.
            self.pieces.append([n // g.shape[0]] * g.shape[0] if g is not None else [n])
            self.spans.append((off, off + n))
            off += n
        self.block_bytes, self.num_blocks = off, nblocks
        self.staged = None
        self.plan = None

    @property
    def piece_bytes(self):
        """The block's pieces, in its byte order, to register: None (whole
        blocks) if the arena's header cannot list them."""
        out = [n for ps in self.pieces for n in ps]
        return out if len(out) <= MAX_PIECES else None

    def staging_align(self):
        """The staging offset's distance past a page boundary to ask the
        sidecar for: half a page from the first tensor's own page offset,
        to the byte (copies between addresses a few bytes apart modulo
        4 KiB run at about half speed, and ones whose ends sit at different
        offsets in their cache lines lose about a tenth), None for device
        memory."""
        po = self.ops.page_offset(self.tensors[0])
        if po is None:
            return None
        return (po + _PAGE // 2) % _PAGE

    def attach(self, arena):
        if arena.block_bytes != self.block_bytes:
            raise ValueError("arena of %d-byte blocks for %d-byte device blocks" % (arena.block_bytes, self.block_bytes))
        self.staged = self.plan = None
        if arena.piece_bytes is None:
            rows = self.ops.staging(arena)
            # Each tensor's columns of the staging slots, typed like it.
            self.staged = [self.ops.typed(rows[:, lo:hi], v) for v, (lo, hi) in zip(self.views, self.spans)]
            return
        if arena.piece_bytes != self.piece_bytes:
            raise ValueError("arena staged for pieces of %s bytes, these have %s" % (arena.piece_bytes, self.piece_bytes))
        # Per tensor: (its bytes (P, B, X), its pieces' runs (P, slots, X))
        # for a gather per run of slots, or (None, its blocks-first view,
        # its one piece's run typed like it) for a tensor that is not
        # contiguous (a copy per run of blocks).
        offs, j, S = arena.piece_offsets(), 0, arena.staging_slots
        self.plan = []
        for v, g, ps in zip(self.views, self.grouped, self.pieces):
            reg = self.ops.region(arena, offs[j], S * len(ps), ps[0])
            j += len(ps)
            if g is None:
                self.plan.append((None, v, self.ops.typed(reg, v)))
            else:
                self.plan.append((g, None, reg.reshape(len(ps), S, ps[0])))

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
            # Consecutive device blocks into consecutive slots: each piece
            # is one contiguous run on both sides, one copy.
            b0 = run[0]
            consecutive = run[-1] - b0 == k - 1 and all(run[i] == b0 + i for i in range(k))
            idx = None if consecutive else ops.index(run)
            for t3, v, reg in self.plan:
                if t3 is None:
                    (ops.save_blocks if save else ops.load_blocks)(v, run, reg, list(range(s0, s0 + k)))
                    continue
                part = reg[:, s0:s0 + k]
                if consecutive:
                    if save:
                        ops.copy(part, t3[:, b0:b0 + k])
                    else:
                        ops.copy(t3[:, b0:b0 + k], part)
                elif save:
                    ops.gather(t3, idx, part)
                else:
                    ops.scatter(t3, idx, part)
