#!/usr/bin/python3
"""An independent vLLM-shaped KV-event publisher for kvmesh's interop test.

Uses pyzmq and msgpack-python (Debian: python3-zmq, python3-msgpack), not
kvmesh code. It binds a PUB and a ROUTER replay socket on random loopback
ports, writes the expected listen lines (JSON, one per event) to argv[1],
prints "READY <pub_endpoint> <replay_endpoint>", then publishes batches in
every shape vLLM and SGLang have used. Some batches are only put in the
replay ring, never on PUB, so the subscriber must repair the gap. After the
scripted batches it publishes empty "tick" batches until stdin closes (or
60 s pass), so a late-joining subscriber always sees a live batch.

Protocol (vLLM): PUB frames (topic, seq u64 BE, msgpack EventBatch);
replay request [identity, "", start u64 BE] -> (identity, "", seq, payload)*
then (identity, "", -1 as i64 BE, b"").
"""
import json
import select
import struct
import sys
import time

import msgpack
import zmq

TOPIC = b"kv@127.0.0.1@model"
U64 = (1 << 64) - 1

FIELDS = ["block_hashes", "parent_block_hash", "token_ids", "block_size",
          "lora_id", "medium", "lora_name", "extra_keys"]


def stored_array(hashes, parent, tokens, bs, medium=None, lora=None, tail=()):
    return ["BlockStored", hashes, parent, tokens, bs, None, medium, lora, None, *tail]


def extra_keys(n_blocks, parent, lora=None, salt=None, mm=None):
    """extra_keys as vLLM's generate_block_hash_extra_keys builds them: per
    block a tuple of the LoRA name, multimodal (id, offset) keys, the salt
    (a request's first block only, i.e. no parent) and embeds digests."""
    out = []
    for i in range(n_blocks):
        keys = []
        if lora:
            keys.append(lora)
        if mm and i == 0:
            keys.extend(mm)
        if salt and i == 0 and parent is None:
            keys.append(salt)
        if mm and i == 0:
            keys.append(b"\x01" * 32)  # a prompt-embeds digest
        out.append(tuple(keys) if keys else None)
    return out


def stored_map(hashes, parent, tokens, bs, medium=None, lora=None, **extra):
    m = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
         "token_ids": tokens, "block_size": bs, "lora_id": None, "medium": medium,
         "lora_name": lora, "extra_keys": None}
    m.update(extra)
    return m


def as_u64(h):
    """The u64 a correct decoder must produce for a wire hash."""
    if isinstance(h, (bytes, bytearray)):
        return int.from_bytes(bytes(h)[-8:], "big")
    return h & U64


def expect(seq, dp_rank, ev, salt=None):
    """The listen line for one wire event, computed independently; salt is
    the cache salt the script put on the event's first block, if any."""
    if isinstance(ev, dict):
        tag = ev["type"]
        get = ev.get
    else:
        tag = ev[0]
        if tag == "BlockStored":
            names = FIELDS
        elif tag == "BlockRemoved":
            names = ["block_hashes", "medium"]
        else:
            names = []
        d = dict(zip(names, ev[1:]))
        get = d.get
    kind = {"BlockStored": "stored", "BlockRemoved": "removed", "AllBlocksCleared": "cleared"}[tag]
    if kind == "cleared":
        hashes, parent, tokens, bs, medium, lora = [], None, [], 0, None, None
    else:
        hashes = [as_u64(h) for h in get("block_hashes")]
        medium = get("medium")
        if kind == "stored":
            p = get("parent_block_hash")
            parent = None if p is None else as_u64(p)
            tokens = list(get("token_ids") or [])
            bs = get("block_size") or 0
            lora = get("lora_name")
        else:
            parent, tokens, bs, lora = None, [], 0, None
    line = {"seq": seq, "dp_rank": dp_rank or 0, "type": kind, "engine_hashes": hashes,
            "parent": parent, "token_ids": tokens, "block_size": bs, "medium": medium,
            "lora_name": lora}
    if salt is not None:
        line["cache_salt"] = salt
    return line


def batches():
    """(skip_live, batch_object, dp_rank, events) for each scripted batch."""
    t = time.time()
    bs = 4
    toks = lambda n, off: [off + 3 * i for i in range(n * bs)]
    out = []
    # 0: classic positional batch and events, u64 hashes incl. > 2^63, and
    #    the newer optional tail (group_idx, kv_cache_spec_kind, window).
    ev = [stored_array([11, 2**63 + 5, U64], None, toks(3, 1), bs, "GPU", None,
                       tail=(0, "full_attention", None)),
          ["BlockRemoved", [11], "GPU", 0]]
    out.append((False, [t, ev, 0], 0, ev))
    # 1: positional batch, map events (vLLM >= #42892), negative i64 hashes,
    #    unknown keys.
    ev = [stored_map([-1, -2**63], -7, toks(2, 50), bs, "CPU", "sql-lora",
                     group_idx=0, locality="LOCAL", future={"a": [1, [2]]})]
    out.append((False, [t, ev, 0], 0, ev))
    # 2: map batch with an unknown key, bytes hashes (32-byte digests).
    h1 = bytes(range(32))
    h2 = bytes(24) + struct.pack(">Q", 0xDEADBEEFCAFEF00D)
    ev = [stored_map([h1, h2], None, toks(2, 7), bs, None, None),
          {"type": "BlockRemoved", "block_hashes": [h2], "medium": "CPU_PINNED", "group_idx": 1}]
    out.append((False, {"ts": t, "events": ev, "data_parallel_rank": 0, "engine": "x"}, 0, ev))
    # 3 (gap): old 5-field positional BlockStored with missing trailing fields.
    ev = [["BlockStored", [77, 78], 11, toks(2, 100), bs]]
    out.append((True, [t, ev, 0], 0, ev))
    # 4 (gap): two-field batch (no dp rank), removal without medium.
    ev = [["BlockRemoved", [77]]]
    out.append((True, [t, ev], None, ev))
    # 5: map batch, cleared in both shapes, a LoRA store on disk.
    ev = [["AllBlocksCleared"], {"type": "AllBlocksCleared"},
          stored_map([300], None, toks(1, 9), bs, "DISK", "adapter-b")]
    out.append((False, {"events": ev, "ts": t}, None, ev))
    # 6 (gap): positional batch with extra trailing batch fields.
    ev = [["BlockRemoved", [-1], "CPU"]]
    out.append((True, [t, ev, 0, "future", [1, 2]], 0, ev))
    # 7: live again.
    ev = [stored_array([501], 300, toks(1, 0), bs, "DISK", "adapter-b")]
    out.append((False, [t, ev, 0], 0, ev))
    # 8: salted requests in vLLM's form. A map event (current vLLM) with the
    #    salt after the LoRA name and multimodal keys in block 0's
    #    extra_keys, its continuation (no salt on the wire: the receiver
    #    inherits it from block 902), and a positional event salted
    #    without a LoRA.
    ev = [stored_map([901, 902], None, toks(2, 200), bs, "GPU", "sql-lora",
                     extra_keys=extra_keys(2, None, "sql-lora", "tenant-a", mm=[("img-1", 3)])),
          stored_map([903], 902, toks(1, 300), bs, "GPU", "sql-lora",
                     extra_keys=extra_keys(1, 902, "sql-lora", "tenant-a")),
          ["BlockStored", [904], None, toks(1, 400), bs, None, "GPU", None,
           extra_keys(1, None, None, "tenant-b")]]
    out.append((False, [t, ev, 0], 0, ev))
    return out


# The salt each scripted salted store names on the wire, by first hash.
SALTS = {901: "tenant-a", 904: "tenant-b"}


def main():
    expected_path = sys.argv[1]
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
    router = ctx.socket(zmq.ROUTER)
    replay_port = router.bind_to_random_port("tcp://127.0.0.1")

    scripted = batches()
    with open(expected_path, "w") as f:
        for seq, (_, _, dp, evs) in enumerate(scripted):
            for ev in evs:
                first = ev["block_hashes"][0] if isinstance(ev, dict) and "block_hashes" in ev else \
                    (ev[1][0] if len(ev) > 1 and ev[1] else None)
                salt = SALTS.get(first) if isinstance(first, int) else None
                f.write(json.dumps(expect(seq, dp, ev, salt)) + "\n")
    print(f"READY tcp://127.0.0.1:{pub_port} tcp://127.0.0.1:{replay_port}", flush=True)

    ring = []
    seq = 0
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    deadline = time.time() + 60
    pending = list(scripted)
    while time.time() < deadline:
        if pending:
            skip, obj, _, _ = pending.pop(0)
        else:
            skip, obj = False, [time.time(), [], 0]  # tick
        payload = msgpack.packb(obj, use_bin_type=True)
        ring.append((seq, payload))
        if not skip:
            pub.send_multipart([TOPIC, struct.pack(">Q", seq), payload])
        seq += 1
        for sock, _ in poller.poll(20):
            if sock is router:
                frames = router.recv_multipart()
                ident, start = frames[0], struct.unpack(">Q", frames[-1])[0]
                for s, p in ring:
                    if s >= start:
                        router.send_multipart([ident, b"", struct.pack(">Q", s), p])
                router.send_multipart([ident, b"", struct.pack(">q", -1), b""])
            else:
                if not sys.stdin.buffer.read1(4096):
                    deadline = 0
    pub.close(0)
    router.close(0)
    ctx.term()


if __name__ == "__main__":
    main()
