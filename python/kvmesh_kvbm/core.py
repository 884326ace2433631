"""What both engines' connectors share: the scheduler's forwarding with its
fallbacks, and the worker's step (bind, copy, save, finish).

The scheduler side never fails the engine: a call the sidecar does not
answer means no match, no offload, no delayed free, counted in
``client.errors``. The worker side keeps enough of its own account
(requests it was told are loading or finishing) to report them done when
the sidecar is gone, so no request waits forever; vLLM recomputes the
blocks whose load did not happen (get_block_ids_with_load_errors).
"""

import logging
import os

from .wire import Client

log = logging.getLogger("kvmesh_kvbm")


class Metadata:
    """One scheduler step's connector metadata, as the engine hands it to
    its workers (pickled): the sidecar keeps the ops, keyed by iteration
    (0: the step was not built, the sidecar being away); ``delayed`` the
    requests whose free the scheduler delayed since the last step (only
    those may be reported finished sending);
    ``loads`` are the device blocks of the loads the scheduler expects
    (request id → block ids), reported as load errors if the step cannot
    be bound."""

    def __init__(self, iteration=0, ops=0, loads=None, delayed=()):
        self.iteration, self.ops, self.loads, self.delayed = iteration, ops, loads or {}, list(delayed)

    def __repr__(self):
        return "kvmesh_kvbm.Metadata(iteration=%d, ops=%d, loads=%d)" % (self.iteration, self.ops, len(self.loads))


class SchedulerCore:
    """The scheduler side: one Client, requests' ids as strings."""

    def __init__(self, shape, socket_path=None, timeout_s=None):
        self.client = Client(socket_path, shape=shape, role="scheduler", timeout_s=timeout_s)
        self.expected_loads = {}  # request id → device blocks an async match will load into
        self.matched = {}  # request id → tokens the last match staged
        self.delayed = []  # requests request_finished delayed since the last build

    def match(self, req, num_computed):
        r = self.client.try_call("match", req=req, num_computed=num_computed)
        if r is None:
            self.matched.pop(req["id"], None)
            return 0, False
        n = int(r.get("tokens", 0))
        if n > 0:
            self.matched[req["id"]] = n
        else:
            self.matched.pop(req["id"], None)
        return n, bool(r.get("async")) and n > 0

    def alloc(self, rid, block_ids, external_blocks=None, **fields):
        """Forwards an allocation; external_blocks are the device blocks
        the staged tokens load into (remembered for the worker's fallback)."""
        if external_blocks:
            self.expected_loads[rid] = list(external_blocks)
        self.client.try_call("alloc", id=rid, block_ids=list(block_ids), **fields)

    def build(self, new, cached, num_scheduled):
        loads, self.expected_loads = self.expected_loads, {}
        delayed, self.delayed = self.delayed, []
        r = self.client.try_call("build", new=new, cached=cached, num_scheduled=num_scheduled)
        if r is None:
            return Metadata(0, 0, loads, delayed)
        return Metadata(int(r.get("iteration", 0)), int(r.get("loads", 0)) + int(r.get("stores", 0)), loads, delayed)

    def finished(self, rid, block_ids):
        self.matched.pop(rid, None)
        r = self.client.try_call("finished", id=rid, block_ids=list(block_ids))
        delay = bool(r and r.get("delay"))
        if delay:
            self.delayed.append(rid)
        return delay

    def stats(self, slot=None):
        return self.client.try_call("stats", slot=slot or "")


class WorkerCore:
    """The worker side of one engine rank."""

    def __init__(self, shape, socket_path=None, timeout_s=None, staging=None):
        self.client = Client(socket_path, shape=shape, role="worker", timeout_s=timeout_s)
        # "pieces" (default): staging slots piece by piece, the faster copy
        # here; "blocks": whole blocks, which spares the sidecar a copy of
        # each block (docs/benchmarks.md §8 has both sides' costs).
        self.staging = staging or os.environ.get("KVMESH_KVBM_STAGING") or "pieces"
        if self.staging not in ("pieces", "blocks"):
            raise ValueError("kvmesh_kvbm: staging %r, want pieces or blocks" % self.staging)
        self.copier = None
        self.arena = None
        self.block_size = 0
        self._register_args = None
        self._bound = []  # iterations bound this step, saved at wait_for_save
        self._stores = []  # (device ids, slots) to copy after the forward pass
        self.load_errors = set()
        self.loading = set()  # ids whose loads were issued and not yet reported
        self.delayed = set()  # ids whose free the scheduler delayed, not yet named finished
        self.finishing = set()  # delayed ids the engine said finished, not yet reported
        self.recved = set()
        self.sent = set()

    def register(self, copier, block_size):
        from .blocks import Arena

        self.copier, self.block_size = copier, block_size
        # piece_bytes asks for the piece-by-piece staging layout; a
        # sidecar that predates it ignores the field and stages whole
        # blocks, which the copier reads from the arena's header.
        self._register_args = dict(block_bytes=copier.block_bytes, block_size=block_size, device_blocks=copier.num_blocks)
        if copier.piece_bytes is not None and self.staging == "pieces":
            self._register_args["piece_bytes"] = copier.piece_bytes
        align = copier.staging_align()
        if align is not None:
            self._register_args["staging_align"] = align
        r = self.client.try_call("register", **self._register_args)
        if r is None:
            log.warning("kvmesh_kvbm: the sidecar at %s did not take the KV cache registration; running without offload",
                        self.client.path)
            return False
        self.arena = Arena(r["arena"])
        copier.attach(self.arena)
        return True

    def _ensure_registered(self):
        if self.arena is not None:
            return True
        if self._register_args is None:
            return False
        return self.register(self.copier, self.block_size)

    def start_load(self, md):
        """Binds a step's metadata and copies its loads onto the device."""
        if md is None:
            return
        expected = dict(md.loads)
        self.loading.update(expected)
        self.delayed.update(getattr(md, "delayed", ()))
        registered = self._ensure_registered()
        if md.ops == 0 and md.iteration != 0:
            return  # built, with nothing to move
        r = None
        if registered and md.iteration != 0:  # iteration 0: the build failed
            r = self.client.try_call("bind", iteration=md.iteration)
        if r is None:
            # The step's loads will not happen: their blocks are recomputed.
            for blocks in expected.values():
                self.load_errors.update(blocks)
            self.recved.update(expected)
            return
        errs = set(r.get("load_errors") or ())
        self.load_errors.update(errs)
        for t in r.get("loads") or ():
            pairs = [(d, s) for d, s in zip(t["device"], t["slots"]) if d not in errs]
            try:
                self.copier.load([d for d, _ in pairs], [s for _, s in pairs])
            except Exception:  # a copy that fails is a load error, never a crash
                log.exception("kvmesh_kvbm: load of %s", t["req"])
                self.load_errors.update(t["device"])
            staged = set(t["device"])
            for d in expected.get(t["req"], ()):
                if d not in staged:
                    self.load_errors.add(d)  # no staging slot: recomputed
        for t in r.get("stores") or ():
            self._stores.append((t["device"], t["slots"]))
        self._bound.append(md.iteration)

    def save(self):
        """After the forward pass: the step's completed blocks into their
        staging slots, then tells the sidecar."""
        stores, self._stores = self._stores, []
        bound, self._bound = self._bound, []
        if not bound:
            return
        for dev, slots in stores:
            try:
                self.copier.save(dev, slots)
            except Exception:
                log.exception("kvmesh_kvbm: save")
        self.client.try_call("saved", iteration=max(bound))

    def finished(self, finishing=(), all_delayed=False):
        """Returns (finished sending, finished receiving) as sets of the
        sidecar's string ids. finishing are the requests the engine says
        finished: vLLM names every finished request, only the delayed ones
        may be reported (all_delayed: the engine names only those, as
        TensorRT-LLM does)."""
        for rid in finishing:
            if all_delayed or rid in self.delayed:
                self.delayed.discard(rid)
                self.finishing.add(rid)
        r = self.client.try_call("get_finished") if self.arena is not None else None
        if r is None:
            # Nothing in flight can complete without the sidecar: report it
            # all done (the loads' blocks are load errors already).
            self.sent.update(self.finishing)
            self.recved.update(self.loading)
        else:
            self.sent.update(r.get("sending") or ())
            self.recved.update(r.get("recving") or ())
        sending = self.sent & self.finishing
        recving = self.recved & self.loading
        self.finishing -= sending
        self.loading -= recving
        # The rest waits until the engine names them (an id may only be
        # returned once the engine passed it in).
        self.sent -= sending
        self.recved -= recving
        return sending, recving

    def take_load_errors(self):
        errs, self.load_errors = self.load_errors, set()
        return errs
