"""The worker's data path against a plain numpy copy of the same bytes.

    PYTHONPATH=python /usr/bin/python3 -m kvmesh_kvbm.bench [--layers 8] [--blocks 64] [--rounds 20]

Builds vLLM-shaped per-layer KV arrays (2, blocks, 16, 8, 128) float16 and
an arena file in /dev/shm laid out as the sidecar lays it out, then
alternates, round after round: BlockCopier.save of --blocks scattered
device blocks into staging slots and .load back (the worker's path), and
numpy copies of the same number of bytes, out and back, between two
contiguous arrays. Prints bytes/s of each (median of rounds) and their
ratio.
"""

import argparse
import os
import statistics
import struct
import tempfile
import time

from .blocks import Arena, BlockCopier, NumpyOps


def make_arena(path, block_bytes, staging):
    """An arena file with no host slots, as the sidecar would write it."""
    data_off = 4096
    with open(path, "wb") as f:
        f.write(struct.pack("<8s6Q", b"KVMESHAR", 1, block_bytes, 0, data_off, staging, data_off))
        f.truncate(data_off + staging * block_bytes)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=64, help="blocks moved per round")
    ap.add_argument("--device-blocks", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=20)
    a = ap.parse_args(argv)
    import numpy as np

    rng = np.random.default_rng(1)
    layers = [rng.standard_normal((2, a.device_blocks, 16, 8, 128)).astype(np.float16) for _ in range(a.layers)]
    copier = BlockCopier([(t, 1) for t in layers], NumpyOps())
    fd, path = tempfile.mkstemp(prefix="kvmesh-kvbm-bench-", suffix=".arena", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.close(fd)
    try:
        make_arena(path, copier.block_bytes, a.blocks)
        arena = Arena(path)
        copier.attach(arena)
        ids = sorted(rng.choice(a.device_blocks, a.blocks, replace=False).tolist())
        slots = list(range(a.blocks))
        nbytes = a.blocks * copier.block_bytes
        src = np.ones(nbytes, np.uint8)
        dst = np.zeros(nbytes, np.uint8)
        want = [t[:, ids].copy() for t in layers]
        path_s, plain_s = [], []
        for r in range(a.rounds + 1):
            t0 = time.perf_counter()
            copier.save(ids, slots)
            ts = time.perf_counter()
            for t in layers:
                t[:, ids] = 0  # evicted from the device (not timed)
            tl = time.perf_counter()
            copier.load(ids, slots)
            t1 = time.perf_counter()
            np.copyto(dst, src)
            np.copyto(src, dst)
            t2 = time.perf_counter()
            if r:  # the first round maps the pages
                path_s.append((ts - t0) + (t1 - tl))
                plain_s.append(t2 - t1)
        for t, w in zip(layers, want):
            if not np.array_equal(t[:, ids], w):
                raise SystemExit("round trip changed the bytes")
        # Both sides move nbytes out and nbytes back per round.
        p, q = 2 * nbytes / statistics.median(path_s), 2 * nbytes / statistics.median(plain_s)
        print("block bytes %d, %d blocks per round (%.1f MiB), %d rounds" % (copier.block_bytes, a.blocks, nbytes / 2**20, a.rounds))
        print("worker path (device -> arena -> device): %.2f GB/s" % (p / 1e9))
        print("plain numpy copy of the same bytes:       %.2f GB/s" % (q / 1e9))
        print("ratio: %.2f" % (p / q))
        arena.close()
    finally:
        os.remove(path)


if __name__ == "__main__":
    main()
