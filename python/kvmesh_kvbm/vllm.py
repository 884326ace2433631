"""kvmesh's KV block manager as a vLLM v1 KV connector.

    --kv-transfer-config '{"kv_connector": "KvmeshConnector",
                           "kv_connector_module_path": "kvmesh_kvbm.vllm",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"socket": "/tmp/kvmesh-kvbm-1000.sock"}}'

``KvmeshConnector`` subclasses vLLM's ``KVConnectorBase_V1`` when vLLM is
importable (the class is built on first access), and is a plain class with
the same methods otherwise, so this module imports with the standard
library alone.
"""

import logging

from .core import Metadata, SchedulerCore, WorkerCore

log = logging.getLogger("kvmesh_kvbm")

SCHEDULER, WORKER = 0, 1  # KVConnectorRole's values


def _role(role):
    v = getattr(role, "value", role)
    if isinstance(v, str):
        return WORKER if v.lower() == "worker" else SCHEDULER
    return int(v)


def _extra(vllm_config):
    kt = getattr(vllm_config, "kv_transfer_config", None)
    extra = getattr(kt, "kv_connector_extra_config", None) or {}
    return extra


def _first_group(block_ids):
    """vLLM gives blocks per KV cache group; kvmesh keeps the first (full
    attention) group's."""
    if block_ids is None:
        return []
    if hasattr(block_ids, "get_block_ids"):
        block_ids = block_ids.get_block_ids()
    if isinstance(block_ids, tuple):
        return list(block_ids[0]) if block_ids else []
    return list(block_ids)


class _KvmeshConnector:
    """vLLM's KVConnectorBase_V1, both roles, driving the kvmesh sidecar."""

    _vllm_base = False

    def __init__(self, vllm_config, role, kv_cache_config=None):
        if self._vllm_base:
            super().__init__(vllm_config, role, kv_cache_config)
        else:
            self._connector_metadata = None
        self._kvmesh_role = _role(role)
        extra = _extra(vllm_config)
        sock, timeout = extra.get("socket"), extra.get("timeout_s")
        cache = getattr(vllm_config, "cache_config", None)
        self._block_size = int(extra.get("block_size") or getattr(cache, "block_size", 0) or 16)
        self._num_blocks = getattr(kv_cache_config, "num_blocks", None)
        if self._kvmesh_role == SCHEDULER:
            self.sched = SchedulerCore("vllm", sock, timeout)
            self._reqs = {}  # id → the engine's Request (its tokens grow)
            self._known = {}  # id → tokens sent to the sidecar
            self._sent_blocks = {}  # id → device blocks sent to the sidecar
        else:
            self.worker = WorkerCore("vllm", sock, timeout, staging=extra.get("staging"))

    # ---- scheduler side ----

    def _wire_request(self, request):
        lora = getattr(request, "lora_request", None)
        toks = list(getattr(request, "all_token_ids", None) or getattr(request, "prompt_token_ids", None) or ())
        return {"id": request.request_id, "tokens": toks,
                "lora": getattr(lora, "lora_name", "") or "" if lora else "",
                "salt": getattr(request, "cache_salt", None) or "",
                "priority": max(0, int(getattr(request, "priority", 0) or 0))}

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        wr = self._wire_request(request)
        self._reqs[request.request_id] = request
        self._known[request.request_id] = len(wr["tokens"])
        self._sent_blocks[request.request_id] = 0  # a new admission: fresh blocks follow
        return self.sched.match(wr, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        rid = request.request_id
        ids = _first_group(blocks)
        sent = self._sent_blocks.get(rid, 0)
        new = ids[sent:]
        self._sent_blocks[rid] = len(ids)
        ext = []
        if num_external_tokens > 0:
            n = num_external_tokens // self._block_size
            ext = ids[len(ids) - n:]
        self.sched.alloc(rid, new, ext, num_external=num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        new, cached = [], []
        for r in scheduler_output.scheduled_new_reqs:
            req = self._reqs.get(r.req_id)
            toks = list(getattr(req, "all_token_ids", None) or r.prompt_token_ids or ())
            self._known[r.req_id] = len(toks)
            lora = getattr(r, "lora_request", None)
            new.append({"req": {"id": r.req_id, "tokens": toks, "lora": getattr(lora, "lora_name", "") if lora else "",
                                "salt": getattr(req, "cache_salt", None) or ""},
                        "block_ids": _first_group(r.block_ids), "num_computed": r.num_computed_tokens})
        c = scheduler_output.scheduled_cached_reqs
        resumed_ids = getattr(c, "resumed_req_ids", None)
        resumed_list = getattr(c, "resumed_from_preemption", None)
        for i, rid in enumerate(c.req_ids):
            resumed = rid in resumed_ids if resumed_ids is not None else bool(resumed_list and resumed_list[i])
            req = self._reqs.get(rid)
            toks = []
            if req is not None:
                all_toks = req.all_token_ids
                toks = list(all_toks[self._known.get(rid, 0):])
                self._known[rid] = len(all_toks)
            elif c.new_token_ids and i < len(c.new_token_ids):
                toks = list(c.new_token_ids[i])
            cached.append({"id": rid, "resumed": resumed, "new_token_ids": toks,
                           "new_block_ids": _first_group(c.new_block_ids[i]) if c.new_block_ids else [],
                           "num_computed": c.num_computed_tokens[i]})
        md = self.sched.build(new, cached, dict(scheduler_output.num_scheduled_tokens))
        return _build()["md"](md.iteration, md.ops, md.loads, md.delayed)

    def request_finished(self, request, block_ids):
        rid = request.request_id
        self._reqs.pop(rid, None)
        self._known.pop(rid, None)
        self._sent_blocks.pop(rid, None)
        return self.sched.finished(rid, _first_group(block_ids)), None

    # ---- worker side ----

    def register_kv_caches(self, kv_caches):
        from .blocks import BlockCopier

        tensors = []
        for t in kv_caches.values():
            shape = tuple(t.shape)
            # (2, blocks, ...) for most backends, (blocks, ...) for the rest.
            axis = 1 if len(shape) > 1 and shape[0] == 2 and (self._num_blocks is None or shape[1] == self._num_blocks) else 0
            tensors.append((t, axis))
        self.worker.register(BlockCopier(tensors), self._block_size)

    def bind_connector_metadata(self, connector_metadata):
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self):
        self._connector_metadata = None

    def start_load_kv(self, forward_context=None, **kwargs):
        self.worker.start_load(self._connector_metadata)

    def wait_for_layer_load(self, layer_name):
        pass  # loads complete in start_load_kv

    def save_kv_layer(self, layer_name, kv_layer=None, attn_metadata=None, **kwargs):
        pass  # whole blocks are saved once the forward pass is done

    def wait_for_save(self):
        self.worker.save()

    def get_finished(self, finished_req_ids):
        sending, recving = self.worker.finished(finished_req_ids or ())
        return (sending or None), (recving or None)

    def get_block_ids_with_load_errors(self):
        return self.worker.take_load_errors()

    def shutdown(self):
        core = getattr(self, "worker", None) or getattr(self, "sched", None)
        if core is not None:
            core.client.close()

    def kvmesh_errors(self):
        """Failed sidecar calls by code (timeouts, unavailable, ...)."""
        core = getattr(self, "worker", None) or getattr(self, "sched", None)
        return dict(core.client.errors)


_built = {}


def _build():
    if "cls" not in _built:
        try:
            from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata
        except ImportError:
            cls = type("KvmeshConnector", (_KvmeshConnector,), {})
            md = type("KvmeshMetadata", (Metadata,), {})
        else:
            cls = type("KvmeshConnector", (_KvmeshConnector, KVConnectorBase_V1), {"_vllm_base": True})
            md = type("KvmeshMetadata", (Metadata, KVConnectorMetadata), {})
        # Named as this module's attributes: vLLM pickles the metadata to
        # its workers, and pickle finds a class by module and name.
        for c in (cls, md):
            c.__module__, c.__qualname__ = __name__, c.__name__
        _built["cls"], _built["md"] = cls, md
    return _built


def __getattr__(name):
    if name == "KvmeshConnector":
        return _build()["cls"]
    if name == "KvmeshMetadata":
        return _build()["md"]
    raise AttributeError(name)
