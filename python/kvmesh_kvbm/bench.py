"""The worker's data path against a plain numpy copy of the same bytes.

    PYTHONPATH=python /usr/bin/python3 -m kvmesh_kvbm.bench [--layers 8] [--blocks 64] [--rounds 20]
        [--ids scattered|consecutive] [--layout pieces|blocks] [--align auto|BYTES]

Builds vLLM-shaped per-layer KV arrays (2, blocks, 16, 8, 128) float16 and
an arena file in /dev/shm laid out as the sidecar lays it out for a worker
that registers its pieces (--layout pieces, staging --align bytes past a
page, by default what the worker asks for; --layout blocks: whole-block
staging, as for a worker that names none), then, round
after round: BlockCopier.save of --blocks device blocks into staging slots
and .load back (the worker's path), and two plain numpy copies of the same
number of bytes, out and back: between two contiguous anonymous arrays
(the issue's baseline), and between a contiguous array and the same arena
mapping the path writes (the same memory on both sides, so the shared
mapping's 4 KiB pages count against neither). The order of the three
rotates every round so none always runs on the caches another left; each
round's ratios are taken within the round, so load that changes between
rounds cancels. Prints bytes/s of each (median of rounds) and the median
of the per-round ratios.
"""

import argparse
import os
import statistics
import struct
import tempfile
import time

from .blocks import Arena, BlockCopier, NumpyOps


def make_arena(path, block_bytes, staging, piece_bytes=None, align=0):
    """An arena file with no host slots, as the sidecar would write it:
    staging align bytes past the first page after the header, whole
    blocks (version 1) or piece by piece (piece_bytes, version 2)."""
    data_off = 4096
    staging_off = data_off + align
    with open(path, "wb") as f:
        f.write(struct.pack("<8s6Q", b"KVMESHAR", 2 if piece_bytes else 1, block_bytes, 0, data_off, staging, staging_off))
        if piece_bytes:
            f.write(struct.pack("<Q%dQ" % len(piece_bytes), len(piece_bytes), *piece_bytes))
        f.truncate(staging_off + staging * block_bytes)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=64, help="blocks moved per round")
    ap.add_argument("--device-blocks", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--ids", choices=("scattered", "consecutive"), default="scattered",
                    help="device blocks moved: a random sorted set, or one run (a fresh cache's allocation)")
    ap.add_argument("--layout", choices=("pieces", "blocks"), default="pieces",
                    help="staging slots piece by piece (arena version 2) or block by block (version 1)")
    ap.add_argument("--align", default="auto",
                    help="the staging offset's bytes past a page: auto (what the worker asks the sidecar for) or a number")
    a = ap.parse_args(argv)
    if not 0 < a.blocks <= a.device_blocks or a.rounds < 1 or a.layers < 1:
        ap.error("need 0 < --blocks <= --device-blocks, --rounds >= 1, --layers >= 1")
    import numpy as np

    rng = np.random.default_rng(1)
    layers = [rng.standard_normal((2, a.device_blocks, 16, 8, 128)).astype(np.float16) for _ in range(a.layers)]
    copier = BlockCopier([(t, 1) for t in layers], NumpyOps())
    fd, path = tempfile.mkstemp(prefix="kvmesh-kvbm-bench-", suffix=".arena", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.close(fd)
    try:
        align = copier.staging_align() if a.align == "auto" else int(a.align)
        make_arena(path, copier.block_bytes, a.blocks, copier.piece_bytes if a.layout == "pieces" else None, align)
        arena = Arena(path)
        copier.attach(arena)
        if a.ids == "consecutive":
            first = int(rng.integers(0, a.device_blocks - a.blocks + 1))
            ids = list(range(first, first + a.blocks))
        else:
            ids = sorted(rng.choice(a.device_blocks, a.blocks, replace=False).tolist())
        slots = list(range(a.blocks))
        nbytes = a.blocks * copier.block_bytes
        src = np.ones(nbytes, np.uint8)
        dst = np.zeros(nbytes, np.uint8)
        dev = np.ones(nbytes, np.uint8)
        mapped = np.frombuffer(arena.mem, np.uint8, count=nbytes, offset=arena.staging_offset)
        want = [t[:, ids].copy() for t in layers]

        def worker_path():
            t0 = time.perf_counter()
            copier.save(ids, slots)
            ts = time.perf_counter()
            for t in layers:
                t[:, ids] = 0  # evicted from the device (not timed)
            tl = time.perf_counter()
            copier.load(ids, slots)
            return (ts - t0) + (time.perf_counter() - tl)

        def plain(x, y):
            def run():
                t0 = time.perf_counter()
                np.copyto(y, x)
                np.copyto(x, y)
                return time.perf_counter() - t0
            return run

        runs = [worker_path, plain(src, dst), plain(dev, mapped)]
        times = [[] for _ in runs]
        for r in range(a.rounds + 1):
            got = [0.0] * len(runs)
            for k in range(len(runs)):
                i = (r + k) % len(runs)
                got[i] = runs[i]()
            if r:  # the first round maps the pages
                for i, t in enumerate(got):
                    times[i].append(t)
        for t, w in zip(layers, want):
            if not np.array_equal(t[:, ids], w):
                raise SystemExit("round trip changed the bytes")
        del mapped
        # Every run moves nbytes out and nbytes back per round.
        rate = [2 * nbytes / statistics.median(ts) for ts in times]
        ratio = [statistics.median(p / q for p, q in zip(times[i], times[0])) for i in (1, 2)]
        print("block bytes %d, %d %s blocks per round (%.1f MiB), %d rounds; staging %s, %d bytes past a page "
              "(device tensors %d)" % (copier.block_bytes, a.blocks, a.ids, nbytes / 2**20, a.rounds, a.layout,
                                       arena.staging_offset % 4096, layers[0].ctypes.data % 4096))
        print("worker path (device -> arena -> device):   %.2f GB/s" % (rate[0] / 1e9))
        print("plain numpy copy, anonymous <-> anonymous: %.2f GB/s" % (rate[1] / 1e9))
        print("plain numpy copy, anonymous <-> arena:     %.2f GB/s" % (rate[2] / 1e9))
        print("ratio path/plain (median of rounds): %.2f vs anonymous, %.2f vs arena" % tuple(ratio))
        arena.close()
    finally:
        os.remove(path)


if __name__ == "__main__":
    main()
