"""BlockCopier over numpy arrays standing in for device tensors (no sidecar)."""

import os
import tempfile
import unittest

import numpy as np

from kvmesh_kvbm.bench import make_arena
from kvmesh_kvbm.blocks import Arena, BlockCopier


class BlockCopierTest(unittest.TestCase):
    def arena(self, copier, slots):
        fd, path = tempfile.mkstemp(suffix=".arena")
        os.close(fd)
        self.addCleanup(os.remove, path)
        make_arena(path, copier.block_bytes, slots)
        a = Arena(path)
        copier.attach(a)
        return a

    def round_trip(self, tensors):
        rng = np.random.default_rng(7)
        for t, _ in tensors:
            t[...] = rng.standard_normal(t.shape).astype(t.dtype)
        c = BlockCopier(tensors)
        self.assertEqual(c.block_bytes, sum(t.nbytes // t.shape[axis] for t, axis in tensors))
        a = self.arena(c, 8)
        # A run of slots (2, 3) over scattered blocks, a run of both
        # blocks and slots (7, 8 into 4, 5) and strays.
        ids, slots = [5, 0, 3, 6, 7, 8], [2, 3, 7, 0, 4, 5]
        want = [np.take(t, ids, axis=axis).copy() for t, axis in tensors]
        c.save(ids, slots)
        # Each slot holds its block's bytes, tensor after tensor.
        for b, s in zip(ids, slots):
            row = np.frombuffer(a.mem, np.uint8, count=c.block_bytes, offset=a.staging_offset + s * c.block_bytes)
            self.assertEqual(row.tobytes(), b"".join(
                np.ascontiguousarray(np.take(t, b, axis=axis)).tobytes() for t, axis in tensors), (b, s))
        for t, axis in tensors:
            np.moveaxis(t, axis, 0)[ids] = 0
        c.load(ids, slots)
        for (t, axis), w in zip(tensors, want):
            np.testing.assert_array_equal(np.take(t, ids, axis=axis), w)
        del row
        c.staged = None
        a.close()

    def test_vllm_layers(self):
        self.round_trip([(np.zeros((2, 9, 4, 2, 8), np.float16), 1) for _ in range(3)])

    def test_trtllm_pool(self):
        self.round_trip([(np.zeros((9, 2, 2, 4, 16), np.float32), 0)])

    def test_mismatched_arena(self):
        c = BlockCopier([(np.zeros((4, 8), np.float32), 0)])
        fd, path = tempfile.mkstemp()
        os.close(fd)
        self.addCleanup(os.remove, path)
        make_arena(path, 16, 2)
        with self.assertRaises(ValueError):
            c.attach(Arena(path))


if __name__ == "__main__":
    unittest.main()
