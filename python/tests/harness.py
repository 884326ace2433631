"""Plays the engines against a real `kvmesh worker` sidecar.

Environment (set by cmd/kvmesh's TestKVBMPythonConnector): KVMESH_BIN, the
kvmesh binary; KVMESH_TEST_NATS, a NATS URL; KVMESH_TEST_VLLM_URL and
KVMESH_TEST_TRTLLM_URL, mock engines the worker attaches to.
"""

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from types import SimpleNamespace

import numpy as np

BS = 16  # tokens per block
LAYERS, HEADS, DIM = 2, 2, 8
NUM_BLOCKS = 32


def env(name):
    v = os.environ.get(name)
    if not v:
        raise RuntimeError("%s is not set: run these tests through go test ./cmd/kvmesh -run TestKVBMPythonConnector" % name)
    return v


class Sidecar:
    """A `kvmesh worker --connector kvbm` process serving the connector."""

    def __init__(self, engine="vllm", host=64, disk=0, staging=16, extra=()):
        self.dir = tempfile.mkdtemp(prefix="kvmesh-kvbm-test-")
        self.socket = os.path.join(self.dir, "kvbm.sock")
        url = env("KVMESH_TEST_VLLM_URL" if engine == "vllm" else "KVMESH_TEST_TRTLLM_URL")
        args = [env("KVMESH_BIN"), "worker", "--engine", engine, "--engine-url", url, "--nats", env("KVMESH_TEST_NATS"),
                "--listen", "127.0.0.1:0", "--log-level", "warn", "--connector", "kvbm", "--kvbm-socket", self.socket,
                "--kvbm-host-blocks", str(host), "--kvbm-staging-blocks", str(staging), "--engine-timeout", "20s"]
        if engine == "trtllm":
            args += ["--kv-events", "off"]
        if disk:
            args += ["--kvbm-disk-blocks", str(disk), "--kvbm-disk-dir", os.path.join(self.dir, "disk"), "--kvbm-disk-filter-off"]
        args += list(extra)
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.stderr = []
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + 30
        line = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.startswith("kvmesh worker ready") or not line:
                break
        if not line.startswith("kvmesh worker ready"):
            self.close()
            raise RuntimeError("worker did not start: %r %s" % (line, "".join(self.stderr)))

    def _drain(self):
        for line in self.proc.stderr:
            self.stderr.append(line)

    def stop(self):
        """SIGSTOP, returning once the process is stopped (signals land
        asynchronously)."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        for _ in range(1000):
            with open("/proc/%d/stat" % self.proc.pid) as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "T":
                    return
            time.sleep(0.005)
        raise RuntimeError("the sidecar did not stop")

    def cont(self):
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        # A killed sidecar cannot remove its arena (the next one of the
        # same instance would).
        for f in glob.glob("/dev/shm/kvmesh-kvbm-*-%d.arena" % self.proc.pid):
            os.remove(f)

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def kv_value(token, pos, layer):
    """What the 'model' computes for one token: depends on the token, its
    position and the layer, so equal prefixes have equal KV."""
    return float((token * 31 + pos * 7 + layer * 13) % 251)


class Device:
    """The engine's device KV cache: vLLM-shaped per-layer (2, blocks, BS,
    heads, dim) arrays, or TensorRT-LLM's one (blocks, layers, 2, ...) pool."""

    def __init__(self, shape="vllm"):
        self.shape = shape
        if shape == "vllm":
            self.layers = {"layer.%d" % i: np.zeros((2, NUM_BLOCKS, BS, HEADS, DIM), np.float16) for i in range(LAYERS)}
        else:
            self.pool = np.zeros((NUM_BLOCKS, LAYERS, 2, BS, HEADS * DIM), np.float16)
        self.free = list(range(NUM_BLOCKS - 1, -1, -1))

    def alloc(self, n):
        return [self.free.pop() for _ in range(n)]

    def release(self, blocks):
        for b in blocks:
            self.wipe(b)
        self.free.extend(reversed(blocks))

    def wipe(self, b):
        if self.shape == "vllm":
            for t in self.layers.values():
                t[:, b] = 0
        else:
            self.pool[b] = 0

    def compute(self, tokens, blocks, start, end):
        """The forward pass writes tokens[start:end]'s KV."""
        for pos in range(start, end):
            b, off = blocks[pos // BS], pos % BS
            for li in range(LAYERS):
                v = kv_value(tokens[pos], pos, li)
                if self.shape == "vllm":
                    self.layers["layer.%d" % li][:, b, off] = v
                else:
                    self.pool[b, li, :, off] = v

    def block_ok(self, tokens, blocks, i):
        """Whether device block blocks[i] holds the KV of tokens' block i."""
        for off in range(BS):
            pos = i * BS + off
            for li in range(LAYERS):
                v = kv_value(tokens[pos], pos, li)
                got = self.layers["layer.%d" % li][:, blocks[i], off] if self.shape == "vllm" else self.pool[blocks[i], li, :, off]
                if not np.all(got == np.float16(v)):
                    return False
        return True


def vllm_config(socket, timeout_s=1.0):
    return SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_connector_extra_config={"socket": socket, "timeout_s": timeout_s}),
        cache_config=SimpleNamespace(block_size=BS))


class VReq:
    """vLLM's Request, as much as the connector reads."""

    def __init__(self, rid, tokens):
        self.request_id = rid
        self.prompt_token_ids = list(tokens)
        self.all_token_ids = list(tokens)
        self.lora_request = None
        self.cache_salt = None
        self.priority = 0
        self.blocks = []
        self.num_computed_tokens = 0


def vllm_output(new=(), cached=(), resumed=(), num=None):
    """A vLLM SchedulerOutput: new is [(req, num_computed)], cached is
    [(req, new_block_ids, num_computed)]."""
    news = [SimpleNamespace(req_id=r.request_id, prompt_token_ids=r.prompt_token_ids, block_ids=(list(r.blocks),),
                            num_computed_tokens=c, lora_request=None) for r, c in new]
    cd = SimpleNamespace(req_ids=[r.request_id for r, _, _ in cached], resumed_req_ids=set(resumed),
                         new_token_ids=[], new_block_ids=[(list(b),) for _, b, _ in cached],
                         num_computed_tokens=[c for _, _, c in cached])
    return SimpleNamespace(scheduled_new_reqs=news, scheduled_cached_reqs=cd, num_scheduled_tokens=dict(num or {}))


class VllmEngine:
    """Drives KvmeshConnector in both roles in vLLM's call order."""

    def __init__(self, socket, timeout_s=1.0):
        from kvmesh_kvbm.vllm import KvmeshConnector

        cfg = vllm_config(socket, timeout_s)
        self.sched = KvmeshConnector(cfg, "scheduler", SimpleNamespace(num_blocks=NUM_BLOCKS))
        self.work = KvmeshConnector(cfg, "worker", SimpleNamespace(num_blocks=NUM_BLOCKS))
        self.dev = Device("vllm")
        self.work.register_kv_caches(self.dev.layers)
        self.finished_ids = set()

    def close(self):
        self.sched.shutdown()
        self.work.shutdown()

    def admit(self, req):
        """The waiting-queue path: match, allocate, report. Returns the
        external tokens (loaded asynchronously when > 0)."""
        n, async_ = self.sched.get_num_new_matched_tokens(req, 0)
        need = (n + BS - 1) // BS if async_ else (len(req.all_token_ids) + BS - 1) // BS
        req.blocks = self.dev.alloc(need)
        self.sched.update_state_after_alloc(req, (list(req.blocks),), n if async_ else 0)
        return n if async_ else 0

    def grow(self, req, total_tokens):
        """Allocates blocks so the request holds total_tokens; returns the new ones."""
        need = (total_tokens + BS - 1) // BS - len(req.blocks)
        new = self.dev.alloc(max(need, 0))
        req.blocks += new
        return new

    def step(self, out, compute=()):
        """One engine step: build, then the worker's bind / load /
        forward (compute: [(req, start, end)]) / save / get_finished."""
        md = self.sched.build_connector_meta(out)
        self.work.bind_connector_metadata(md)
        self.work.start_load_kv(None)
        for req, start, end in compute:
            self.dev.compute(req.all_token_ids, req.blocks, start, end)
        self.work.wait_for_save()
        fin, self.finished_ids = self.finished_ids, set()
        sending, recving = self.work.get_finished(fin)
        self.work.clear_connector_metadata()
        return md, set(sending or ()), set(recving or ())

    def finish(self, req):
        delay, _ = self.sched.request_finished(req, list(req.blocks))
        self.finished_ids.add(req.request_id)
        return delay

    def stats(self, slot=None):
        return self.sched.sched.stats(slot)
