"""The engines' connector call sequences against a real kvmesh sidecar."""

import glob
import os
import sys
import unittest
from types import SimpleNamespace
from unittest import mock

sys.path.insert(0, os.path.dirname(__file__))

from harness import BS, NUM_BLOCKS, Device, Sidecar, VllmEngine, VReq, vllm_output  # noqa: E402


def prompt(seed, n):
    return [(seed * 1000 + i * 7) % 32000 + 1 for i in range(n)]


def started(test, host=64, disk=0, timeout_s=1.0):
    """A vLLM-shaped sidecar and engine, closed with the test."""
    sc = Sidecar("vllm", host=host, disk=disk)
    test.addCleanup(sc.close)
    eng = VllmEngine(sc.socket, timeout_s)
    test.addCleanup(eng.close)
    return sc, eng


def computed_and_evicted(eng, req):
    """Prefills req in one step, finishes it and frees its device blocks:
    its full blocks are in the tiers only."""
    eng.admit(req)
    n = len(req.all_token_ids)
    eng.step(vllm_output(new=[(req, 0)], num={req.request_id: n}), compute=[(req, 0, n)])
    eng.finish(req)
    eng.dev.release(req.blocks)


class VllmSequences(unittest.TestCase):
    whole_blocks = False  # the worker names its pieces: staged piece by piece

    def setUp(self):
        self.sc, self.eng = started(self)

    def test_staging_layout(self):
        w = self.eng.work.worker
        self.assertIsNotNone(w.arena)
        if self.whole_blocks:
            self.assertIsNone(w.arena.piece_bytes)
        else:
            self.assertEqual(w.arena.piece_bytes, w.copier.piece_bytes)
            self.assertEqual(len(w.arena.piece_bytes), 2 * len(self.eng.dev.layers))  # each layer's K and V
            self.assertEqual(w.arena.staging_offset % 4096, w.copier.staging_align())

    def compute_whole(self, req):
        """Admits and prefills req in one step; returns the step's metadata."""
        self.assertEqual(self.eng.admit(req), 0)
        n = len(req.all_token_ids)
        md, _, _ = self.eng.step(vllm_output(new=[(req, 0)], num={req.request_id: n}), compute=[(req, 0, n)])
        return md

    def test_offload_then_async_onboard(self):
        toks = prompt(1, 2 * BS + 8)
        a = VReq("a", toks)
        self.compute_whole(a)
        st = self.eng.stats("a")
        self.assertEqual(st["stats"]["OffloadedHost"], 2, st)
        self.assertEqual(st["slot"]["evaluated"], 2)
        self.assertFalse(self.eng.finish(a))
        self.eng.dev.release(a.blocks)  # evicted from the device

        # The same prompt: both full blocks come back from the host tier,
        # asynchronously: b is not scheduled until the worker reports it.
        b = VReq("b", toks)
        other = VReq("other", prompt(2, BS))
        self.assertEqual(self.eng.admit(b), 2 * BS)
        self.eng.admit(other)
        md, _, recving = self.eng.step(vllm_output(new=[(other, 0)], num={"other": BS}), compute=[(other, 0, BS)])
        self.assertEqual(recving, {"b"})
        self.assertEqual(self.eng.work.get_block_ids_with_load_errors(), set())
        for i in range(2):
            self.assertTrue(self.eng.dev.block_ok(toks, b.blocks, i), "block %d not loaded" % i)
        st = self.eng.stats("b")
        self.assertEqual(st["slot"]["loaded_host"], 2 * BS)
        self.assertEqual(st["stats"]["OnboardedHost"], 2)
        # Then it is scheduled with the loaded tokens computed.
        self.eng.sched.update_state_after_alloc(b, (list(b.blocks) + self.eng.grow(b, len(toks)),), 0)
        _, _, _ = self.eng.step(vllm_output(new=[(b, 2 * BS)], num={"b": 8}), compute=[(b, 2 * BS, len(toks))])
        st = self.eng.stats("b")
        self.assertEqual(st["slot"]["current"], len(toks))
        self.assertEqual(st["stats"]["OffloadedHost"], 2 + 1)  # other's block; b's were on the host already

    def test_chunked_prefill(self):
        toks = prompt(3, 4 * BS)
        r = VReq("r", toks)
        self.eng.admit(r)
        chunks = [(0, 24), (24, 48), (48, 64)]
        want_stored = [1, 3, 4]  # full blocks after each chunk
        for i, (s, e) in enumerate(chunks):
            out = vllm_output(new=[(r, 0)], num={"r": e - s}) if i == 0 else vllm_output(cached=[(r, [], s)], num={"r": e - s})
            self.eng.step(out, compute=[(r, s, e)])
            st = self.eng.stats("r")
            self.assertEqual(st["stats"]["OffloadedHost"], want_stored[i], "after chunk %d: %s" % (i, st))
            self.assertEqual(st["slot"]["evaluated"], want_stored[i])

    def test_preemption(self):
        toks = prompt(4, 3 * BS)
        r = VReq("r", toks)
        self.eng.admit(r)
        self.eng.step(vllm_output(new=[(r, 0)], num={"r": 2 * BS}), compute=[(r, 0, 2 * BS)])
        # Preempted: vLLM frees its blocks and admits it again later.
        self.eng.dev.release(r.blocks)
        n = self.eng.admit(r)
        self.assertEqual(n, 2 * BS, "the preempted request's offloaded blocks are matched")
        md, _, recving = self.eng.step(vllm_output())
        self.assertEqual(recving, {"r"})
        for i in range(2):
            self.assertTrue(self.eng.dev.block_ok(toks, r.blocks, i))
        self.eng.sched.update_state_after_alloc(r, (list(r.blocks) + self.eng.grow(r, len(toks)),), 0)
        self.eng.step(vllm_output(cached=[(r, r.blocks, 2 * BS)], resumed=["r"], num={"r": BS}), compute=[(r, 2 * BS, 3 * BS)])
        st = self.eng.stats("r")
        self.assertEqual(st["stats"]["OffloadedHost"], 3, "nothing is offloaded twice")

    def test_finish_while_offloading(self):
        toks = prompt(5, 2 * BS)
        r = VReq("r", toks)
        self.eng.admit(r)
        md = self.eng.sched.build_connector_meta(vllm_output(new=[(r, 0)], num={"r": 2 * BS}))
        # The request finishes (aborted, say) while its store is in flight:
        # its blocks must stay until the worker reports it sent.
        self.assertTrue(self.eng.sched.request_finished(r, list(r.blocks))[0])
        self.eng.work.bind_connector_metadata(md)
        self.eng.work.start_load_kv(None)
        self.eng.dev.compute(toks, r.blocks, 0, 2 * BS)
        self.eng.work.wait_for_save()
        # vLLM names it finished to the workers in the next step.
        self.assertEqual(self.eng.work.get_finished(set()), (None, None))
        self.eng.finished_ids.add("r")
        _, sending, _ = self.eng.step(vllm_output())
        self.assertEqual(sending, {"r"})
        st = self.eng.stats()
        self.assertEqual(st["stats"]["OffloadedHost"], 2)
        self.assertEqual(st["slots"], 0)

class VllmSequencesWholeBlocks(VllmSequences):
    """The same sequences with a worker that names no pieces, as one of
    before piece_bytes: the sidecar stages whole blocks (arena version 1)."""

    whole_blocks = True

    def setUp(self):
        from kvmesh_kvbm import wire

        call = wire.Client.try_call

        def older(client, op, **fields):
            if op == "register":
                fields.pop("piece_bytes", None)
                fields.pop("staging_align", None)
            return call(client, op, **fields)

        p = mock.patch.object(wire.Client, "try_call", older)
        p.start()
        self.addCleanup(p.stop)
        super().setUp()


class StagingKnob(unittest.TestCase):
    def test_blocks(self):
        # KVMESH_KVBM_STAGING=blocks: whole-block staging, still placed
        # half a page from the tensors' page offset.
        with mock.patch.dict(os.environ, {"KVMESH_KVBM_STAGING": "blocks"}):
            _, eng = started(self)
        w = eng.work.worker
        self.assertIsNone(w.arena.piece_bytes)
        self.assertEqual(w.arena.staging_offset % 4096, w.copier.staging_align())
        toks = prompt(9, 2 * BS + 8)
        computed_and_evicted(eng, VReq("a", toks))
        b = VReq("b", toks)
        self.assertEqual(eng.admit(b), 2 * BS)
        _, _, recving = eng.step(vllm_output(), compute=[])
        self.assertEqual(recving, {"b"})
        for i in range(2):
            self.assertTrue(eng.dev.block_ok(toks, b.blocks, i), "block %d not loaded" % i)


class TieredRoundTrip(unittest.TestCase):
    def test_host_and_disk(self):
        # 2 host blocks, 16 on disk (every host block goes on to disk):
        # early blocks are evicted from host and come back from disk.
        _, eng = started(self, host=2, disk=16)
        toks = prompt(6, 4 * BS + 1)
        computed_and_evicted(eng, VReq("a", toks))
        st = eng.stats()["stats"]
        self.assertEqual(st["OffloadedDisk"], 4, st)
        self.assertEqual(st["HostBlocks"], 2)
        b = VReq("b", toks)
        self.assertEqual(eng.admit(b), 4 * BS)
        _, _, recving = eng.step(vllm_output())
        self.assertEqual(recving, {"b"})
        self.assertEqual(eng.work.get_block_ids_with_load_errors(), set())
        for i in range(4):
            self.assertTrue(eng.dev.block_ok(toks, b.blocks, i), "block %d" % i)
        st = eng.stats("b")
        self.assertEqual(st["slot"]["loaded_disk"], 4 * BS, st)
        self.assertEqual(st["stats"]["Corrupt"], 0)
        self.assertEqual(st["stats"]["OnboardedDisk"], 4)


    def test_corrupt_disk_block_is_recomputed(self):
        # Every block on disk (2 host slots), the first one's bytes flipped
        # in the pool file: its checksum fails at the load, it is dropped,
        # and the engine recomputes it and what follows.
        sc, eng = started(self, host=2, disk=16)
        toks = prompt(12, 4 * BS + 1)
        computed_and_evicted(eng, VReq("a", toks))
        pool = glob.glob(os.path.join(sc.dir, "disk", "kvbm-*.g3"))
        self.assertEqual(len(pool), 1, pool)
        # Slot 0's payload: the data region starts on the first 2 MiB
        # boundary (kvbm's disk layout).
        with open(pool[0], "r+b") as f:
            f.seek(2 << 20)
            b = f.read(1)
            f.seek(2 << 20)
            f.write(bytes([b[0] ^ 0xFF]))
        b = VReq("b", toks)
        self.assertEqual(eng.admit(b), 4 * BS)
        _, _, recving = eng.step(vllm_output())
        self.assertEqual(recving, {"b"})
        self.assertEqual(eng.work.get_block_ids_with_load_errors(), set(b.blocks[:4]))
        st = eng.stats("b")["stats"]
        self.assertEqual(st["Corrupt"], 1, st)
        self.assertEqual(st["OnboardedDisk"], 0)


class SidecarFailures(unittest.TestCase):
    def test_kill_mid_request(self):
        sc, eng = started(self, timeout_s=0.5)
        toks = prompt(7, 2 * BS + 3)
        computed_and_evicted(eng, VReq("a", toks))
        b = VReq("b", toks)
        self.assertEqual(eng.admit(b), 2 * BS)  # an async load is promised ...
        sc.kill()  # ... and the sidecar dies before it runs
        _, _, recving = eng.step(vllm_output())
        # The engine is told the load is over and recomputes its blocks.
        self.assertEqual(recving, {"b"})
        self.assertEqual(eng.work.get_block_ids_with_load_errors(), set(b.blocks[:2]))
        # It goes on serving without the tiers: no match, nothing delayed.
        c = VReq("c", prompt(8, 2 * BS))
        self.assertEqual(eng.admit(c), 0)
        eng.step(vllm_output(new=[(c, 0)], num={"c": 2 * BS}), compute=[(c, 0, 2 * BS)])
        self.assertFalse(eng.finish(c))
        # vLLM names every finished request to its workers; one whose free
        # was not delayed is never reported back (vLLM asserts on it).
        _, sending, recving = eng.step(vllm_output())
        self.assertEqual((sending, recving), (set(), set()))
        self.assertGreater(eng.sched.sched.client.error_count(), 0)
        self.assertGreater(eng.work.worker.client.error_count(), 0)

    def test_stalled_sidecar_times_out(self):
        sc, eng = started(self, timeout_s=0.3)
        sc.stop()
        try:
            r = VReq("r", prompt(9, 2 * BS))
            self.assertEqual(eng.admit(r), 0)  # no answer within the timeout: no match
            self.assertEqual(eng.sched.sched.client.errors.get("timeout"), 1)
            # Later calls do not wait again while the sidecar is away.
            self.assertFalse(eng.finish(r))
            self.assertEqual(eng.sched.sched.client.errors.get("timeout"), 1)
            self.assertGreaterEqual(eng.sched.sched.client.errors.get("unavailable", 0), 1)
        finally:
            sc.cont()


class TRTLLMSequences(unittest.TestCase):
    def setUp(self):
        self.sc = Sidecar("trtllm", host=64)
        self.addCleanup(self.sc.close)
        os.environ["KVMESH_KVBM_SOCKET"] = self.sc.socket
        os.environ["KVMESH_KVBM_BLOCK_SIZE"] = str(BS)
        from kvmesh_kvbm.trtllm import KvmeshConnectorScheduler, KvmeshConnectorWorker

        self.sched = KvmeshConnectorScheduler(None)
        self.work = KvmeshConnectorWorker(None)
        self.dev = Device("trtllm")
        self.work.register_kv_caches(self.dev.pool)
        self.addCleanup(self.sched.core.client.close)
        self.addCleanup(self.work.core.client.close)

    def test_staging_layout(self):
        # TensorRT-LLM's pool has the block axis first: one piece a block.
        a = self.work.core.arena
        self.assertEqual(a.piece_bytes, [self.dev.pool.nbytes // self.dev.pool.shape[0]])

    def req(self, rid, toks, gen_only=False):
        return SimpleNamespace(request_id=rid, get_tokens=lambda beam: list(toks), is_generation_only_request=gen_only,
                               context_current_position=0)

    def step(self, new=(), cached=(), compute=(), finished=(), loading=()):
        """new/cached: [(id, new_tokens, new_block_ids, computed_position, num_scheduled)]."""
        rd = lambda t: SimpleNamespace(request_id=t[0], new_tokens=t[1], new_block_ids=t[2], computed_position=t[3],
                                       num_scheduled_tokens=t[4])
        md = self.sched.build_connector_meta(SimpleNamespace(new_requests=[rd(t) for t in new], cached_requests=[rd(t) for t in cached]))
        self.work.bind_connector_meta(md)
        self.work.start_load_kv()
        for toks, blocks, s, e in compute:
            self.dev.compute(toks, blocks, s, e)
        self.work.wait_for_save()
        out = self.work.get_finished(list(finished), list(loading))
        self.work._clear_connector_meta()
        return out

    def test_context_only_then_generation_only(self):
        # The prefill (context-only) side of a disaggregated pair computes
        # and offloads its prompt ...
        toks = prompt(10, 3 * BS + 2)
        ctx = self.req(101, toks)
        self.assertEqual(self.sched.get_num_new_matched_tokens(ctx, 0), (0, False))
        blocks = self.dev.alloc(4)
        self.sched.update_state_after_alloc(ctx, blocks)
        self.step(new=[(101, toks, blocks, 0, len(toks))], compute=[(toks, blocks, 0, len(toks))])
        st = self.sched.core.stats("101")
        self.assertEqual(st["stats"]["OffloadedHost"], 3)
        self.assertFalse(self.sched.request_finished(ctx, blocks))
        # ... and the generation-only request of the decode side matches
        # nothing, though the host holds its prompt.
        gen = self.req(102, toks, gen_only=True)
        self.assertEqual(self.sched.get_num_new_matched_tokens(gen, 0), (0, False))

    def test_chunked_context_and_onboard(self):
        toks = prompt(11, 4 * BS)
        r = self.req(1, toks)
        self.sched.get_num_new_matched_tokens(r, 0)
        blocks = self.dev.alloc(4)
        self.sched.update_state_after_alloc(r, blocks)
        self.step(new=[(1, toks, blocks, 0, 40)], compute=[(toks, blocks, 0, 40)])
        self.step(cached=[(1, [], [], 40, 24)], compute=[(toks, blocks, 40, 64)])
        self.assertEqual(self.sched.core.stats()["stats"]["OffloadedHost"], 4)
        self.sched.request_finished(r, blocks)
        self.dev.release(blocks)
        # Again: three blocks load (the last is left to compute).
        r2 = self.req(2, toks)
        n, async_ = self.sched.get_num_new_matched_tokens(r2, 0)
        self.assertEqual((n, async_), (3 * BS, True))
        blocks2 = self.dev.alloc(4)
        r2.context_current_position = n
        self.sched.update_state_after_alloc(r2, blocks2)
        sending, recving = self.step(loading=[2])
        self.assertEqual(recving, [2])
        for i in range(3):
            self.assertTrue(self.dev.block_ok(toks, blocks2, i), "block %d" % i)


if __name__ == "__main__":
    unittest.main()
