"""BlockCopier over numpy arrays standing in for device tensors (no sidecar)."""

import os
import tempfile
import unittest

import numpy as np

try:
    import torch
except ImportError:
    torch = None

from kvmesh_kvbm.bench import make_arena
from kvmesh_kvbm.blocks import Arena, BlockCopier


class BlockCopierTest(unittest.TestCase):
    def arena(self, copier, slots, layout, align=0):
        fd, path = tempfile.mkstemp(suffix=".arena")
        os.close(fd)
        self.addCleanup(os.remove, path)
        make_arena(path, copier.block_bytes, slots, copier.piece_bytes if layout == "pieces" else None, align)
        a = Arena(path)
        self.assertEqual(a.piece_bytes, copier.piece_bytes if layout == "pieces" else None)
        copier.attach(a)
        return a

    def staged_block(self, a, c, s):
        """Slot s's block bytes as the sidecar reads them."""
        if a.piece_bytes is None:
            return np.frombuffer(a.mem, np.uint8, count=c.block_bytes, offset=a.staging_offset + s * c.block_bytes).tobytes()
        return b"".join(np.frombuffer(a.mem, np.uint8, count=n, offset=off + s * n).tobytes()
                        for n, off in zip(a.piece_bytes, a.piece_offsets()))

    def round_trip(self, tensors, layout, align=0):
        rng = np.random.default_rng(7)
        for t, _ in tensors:
            t[...] = rng.standard_normal(t.shape).astype(t.dtype)
        c = BlockCopier(tensors)
        self.assertEqual(c.block_bytes, sum(t.nbytes // t.shape[axis] for t, axis in tensors))
        a = self.arena(c, 8, layout, align)
        self.assertEqual(a.staging_offset % 4096, align)
        # A run of slots (2, 3) over scattered blocks (gathered), a run of
        # both blocks and slots (7, 8 into 4, 5: one copy a piece) and
        # strays.
        ids, slots = [5, 0, 3, 6, 7, 8], [2, 3, 7, 0, 4, 5]
        want = [np.take(t, ids, axis=axis).copy() for t, axis in tensors]
        c.save(ids, slots)
        # Each slot holds its block's bytes, tensor after tensor.
        for b, s in zip(ids, slots):
            self.assertEqual(self.staged_block(a, c, s), b"".join(
                np.ascontiguousarray(np.take(t, b, axis=axis)).tobytes() for t, axis in tensors), (b, s))
        for t, axis in tensors:
            np.moveaxis(t, axis, 0)[ids] = 0
        c.load(ids, slots)
        for (t, axis), w in zip(tensors, want):
            np.testing.assert_array_equal(np.take(t, ids, axis=axis), w)
        # A block the engine does not have is refused, not clipped.
        with self.assertRaises(IndexError):
            c.save([c.num_blocks], [1])
        c.staged = c.plan = None
        a.close()

    def test_vllm_layers(self):
        for layout in ("blocks", "pieces"):
            with self.subTest(layout=layout):
                self.round_trip([(np.zeros((2, 9, 4, 2, 8), np.float16), 1) for _ in range(3)], layout, 2048)

    def test_trtllm_pool(self):
        for layout in ("blocks", "pieces"):
            with self.subTest(layout=layout):
                self.round_trip([(np.zeros((9, 2, 2, 4, 16), np.float32), 0)], layout)

    def test_not_contiguous(self):
        # A tensor that is a strided view (no byte rows without a copy) is
        # copied run by run, next to a contiguous one gathered.
        base = np.zeros((2, 9, 4, 2, 16), np.float16)
        for layout in ("blocks", "pieces"):
            with self.subTest(layout=layout):
                self.round_trip([(base[..., ::2], 1), (np.zeros((2, 9, 4, 2, 8), np.float16), 1)], layout, 64)

    def test_too_many_pieces(self):
        # More pieces than the arena's header lists: whole-block staging.
        c = BlockCopier([(np.zeros((2, 3, 4), np.float16), 1) for _ in range(300)])
        self.assertIsNone(c.piece_bytes)
        self.assertEqual(BlockCopier([(np.zeros((2, 3, 4), np.float16), 1)]).piece_bytes, [8, 8])

    def test_staging_align(self):
        t = np.zeros((2, 9, 4, 2, 8), np.float16)
        al = BlockCopier([(t, 1)]).staging_align()
        self.assertEqual((al - t.ctypes.data) % 4096, 2048, (al, t.ctypes.data % 4096))

    def test_mismatched_arena(self):
        c = BlockCopier([(np.zeros((4, 8), np.float32), 0)])
        fd, path = tempfile.mkstemp()
        os.close(fd)
        self.addCleanup(os.remove, path)
        make_arena(path, 16, 2)
        with self.assertRaises(ValueError):
            c.attach(Arena(path))
        make_arena(path, 32, 2, [16, 16])  # the right size, other tensors
        with self.assertRaises(ValueError):
            c.attach(Arena(path))


@unittest.skipIf(torch is None, "torch is not installed (the engine's environment has it: .venv-vllm/bin/python -m unittest)")
class TorchCopierTest(unittest.TestCase):
    """TorchOps, the engine's path, over CPU tensors: the same bytes in the
    same places as NumpyOps."""

    def test_round_trip(self):
        for layout in ("pieces", "blocks"):
            for shape, axis in (((2, 9, 4, 2, 8), 1), ((9, 2, 2, 4, 16), 0)):
                with self.subTest(layout=layout, shape=shape):
                    ts = [torch.randn(shape).to(torch.bfloat16) for _ in range(3)]
                    c = BlockCopier([(t, axis) for t in ts])
                    fd, path = tempfile.mkstemp(suffix=".arena")
                    os.close(fd)
                    self.addCleanup(os.remove, path)
                    make_arena(path, c.block_bytes, 8, c.piece_bytes if layout == "pieces" else None, c.staging_align())
                    a = Arena(path)
                    c.attach(a)
                    ids, slots = [5, 0, 3, 6, 7, 8], [2, 3, 7, 0, 4, 5]
                    sel = torch.tensor(ids)
                    want = [t.index_select(axis, sel).clone() for t in ts]
                    c.save(ids, slots)
                    for b, s in zip(ids, slots):
                        exp = b"".join(t.select(axis, b).contiguous().view(torch.uint8).numpy().tobytes() for t in ts)
                        self.assertEqual(BlockCopierTest.staged_block(self, a, c, s), exp, (b, s))
                    for t in ts:
                        t.index_fill_(axis, sel, 0)
                    c.load(ids, slots)
                    for t, w in zip(ts, want):
                        self.assertTrue(torch.equal(t.index_select(axis, sel), w))
                    c.plan = c.staged = None


if __name__ == "__main__":
    unittest.main()
