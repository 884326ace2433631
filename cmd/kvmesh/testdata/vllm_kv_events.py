"""Reads running vLLMs' KV events back from their replay endpoints with
vLLM's own msgspec types (not kvmesh's decoder) and prints, as a JSON list
with one object per endpoint, what each engine holds per medium after all
of them, each stored block's parent, and the media and LoRA names seen.

Usage: python vllm_kv_events.py tcp://127.0.0.1:REPLAY_PORT...
"""

import json
import sys

import msgspec
import zmq
from vllm.distributed.kv_events import (AllBlocksCleared, BlockRemoved,
                                        BlockStored, KVEventBatch)


def as_int(h):
    # vLLM publishes 64-bit ints by default; bytes when
    # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 (then kvmesh keeps the low 8).
    return h if isinstance(h, int) else int.from_bytes(h[-8:], "big")


def holdings(ctx, endpoint):
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 30000)
    sock.connect(endpoint)
    sock.send_multipart([b"", (0).to_bytes(8, "big")])
    dec = msgspec.msgpack.Decoder(KVEventBatch)
    held, parents, media, loras = {}, {}, set(), set()
    batches = 0
    while True:
        _, _, seq, payload = sock.recv_multipart()
        if int.from_bytes(seq, "big", signed=True) == -1:
            break
        batches += 1
        for ev in dec.decode(payload).events:
            if isinstance(ev, BlockStored):
                media.add(ev.medium)
                loras.add(ev.lora_name)
                prev = ev.parent_block_hash
                for h in ev.block_hashes:
                    parents[as_int(h)] = None if prev is None else as_int(prev)
                    prev = h
                held.setdefault(ev.medium, set()).update(as_int(h) for h in ev.block_hashes)
            elif isinstance(ev, BlockRemoved):
                held.setdefault(ev.medium, set()).difference_update(as_int(h) for h in ev.block_hashes)
            elif isinstance(ev, AllBlocksCleared):
                held = {}
    sock.close()
    return {
        "batches": batches,
        "held": {m: sorted(hs) for m, hs in held.items() if hs},
        "parents": [[h, p] for h, p in parents.items()],
        "media": sorted(str(m) for m in media),
        "loras": sorted(str(l) for l in loras),
    }


def main():
    # One process for all endpoints: importing vLLM takes seconds.
    ctx = zmq.Context()
    json.dump([holdings(ctx, ep) for ep in sys.argv[1:]], sys.stdout)


if __name__ == "__main__":
    main()
