"""kvmesh's KV block manager as a TensorRT-LLM KV cache connector.

    kv_connector_config:
      connector_module: kvmesh_kvbm.trtllm
      connector_scheduler_class: KvmeshConnectorScheduler
      connector_worker_class: KvmeshConnectorWorker

with the sidecar's socket in ``KVMESH_KVBM_SOCKET`` (TensorRT-LLM's
connector config takes no extra fields). The classes follow
``KvCacheConnectorScheduler`` / ``KvCacheConnectorWorker``
(tensorrt_llm/_torch/pyexecutor/kv_cache_connector.py): the scheduler runs
on rank 0 and forwards each call, with every request's
``num_scheduled_tokens`` and ``computed_position``; the worker binds the
step's metadata, copies loads in ``start_load_kv`` and stores in
``wait_for_save``, and reports completions in ``get_finished``.

They do not subclass TensorRT-LLM's ABCs (importing those pulls in torch
and the bindings); TensorRT-LLM instantiates them by name and calls the
methods below.
"""

import os

from .core import SchedulerCore, WorkerCore

DEFAULT_TOKENS_PER_BLOCK = 32  # TensorRT-LLM's default tokens_per_block


def _block_size(llm_args):
    env = os.environ.get("KVMESH_KVBM_BLOCK_SIZE")
    if env:
        return int(env)
    for path in (("kv_cache_config", "tokens_per_block"), ("tokens_per_block",), ("build_config", "plugin_config", "tokens_per_block")):
        v = llm_args
        for a in path:
            v = getattr(v, a, None)
        if isinstance(v, int) and v > 0:
            return v
    return DEFAULT_TOKENS_PER_BLOCK


def _tokens(request):
    get = getattr(request, "get_tokens", None)
    if get is not None:
        return list(get(0))
    return list(getattr(request, "tokens", ()))


class KvmeshConnectorScheduler:
    """TensorRT-LLM's KvCacheConnectorScheduler, forwarding to the sidecar."""

    def __init__(self, llm_args=None):
        self._llm_args = llm_args
        self.block_size = _block_size(llm_args)
        self.core = SchedulerCore("trtllm", os.environ.get("KVMESH_KVBM_SOCKET"))
        # The generation-only (decode side) requests a patched manager lets
        # through match nothing.
        self.supports_generation_only_requests = True

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        rid = str(request.request_id)
        req = {"id": rid, "tokens": _tokens(request),
               "generation_only": bool(getattr(request, "is_generation_only_request", False)),
               "priority": 0}
        lora = getattr(request, "lora_task_id", None)
        if lora is not None:
            req["lora"] = str(lora)
        salt = getattr(request, "cache_salt_id", None)
        if salt is not None:
            req["salt"] = str(salt)
        return self.core.match(req, num_computed_tokens)

    def update_state_after_alloc(self, request, block_ids):
        rid = str(request.request_id)
        pos = int(getattr(request, "context_current_position", 0))
        matched = self.core.matched.pop(rid, 0)
        ext = []
        if matched:
            # The matched tokens load into the blocks after the device hit.
            first = (pos - matched) // self.block_size
            ext = list(block_ids)[first:first + matched // self.block_size]
        self.core.alloc(rid, list(block_ids), ext, context_position=pos)

    def build_connector_meta(self, scheduler_output):
        def data(r):
            return {"id": str(r.request_id), "new_tokens": list(r.new_tokens), "new_block_ids": list(r.new_block_ids),
                    "computed_position": int(r.computed_position)}

        num = {}
        for r in list(scheduler_output.new_requests) + list(scheduler_output.cached_requests):
            n = getattr(r, "num_scheduled_tokens", None)
            if n is None:
                raise RuntimeError("kvmesh_kvbm needs TensorRT-LLM's num_scheduled_tokens (TensorRT-LLM >= 1.2)")
            num[str(r.request_id)] = int(n)
        return self.core.build([data(r) for r in scheduler_output.new_requests],
                               [data(r) for r in scheduler_output.cached_requests], num)

    def request_finished(self, request, cache_block_ids):
        return self.core.finished(str(request.request_id), list(cache_block_ids))


class KvmeshConnectorWorker:
    """TensorRT-LLM's KvCacheConnectorWorker, copying blocks through the
    sidecar's arena."""

    def __init__(self, llm_args=None):
        self._llm_args = llm_args
        self._metadata = None
        self.block_size = _block_size(llm_args)
        self.core = WorkerCore("trtllm", os.environ.get("KVMESH_KVBM_SOCKET"))
        self._ids = {}  # the sidecar's string ids → the engine's ids

    def bind_connector_meta(self, metadata):
        self._metadata = metadata

    def get_connector_meta(self):
        return self._metadata

    def _clear_connector_meta(self):
        self._metadata = None

    def register_forward_pass_callable(self):
        return None

    def register_kv_caches(self, kv_cache_tensor):
        from .blocks import BlockCopier

        # One pool, blocks first.
        self.core.register(BlockCopier([(kv_cache_tensor, 0)]), self.block_size)

    def start_load_kv(self, stream=None):
        self.core.start_load(self._metadata)

    def wait_for_layer_load(self, layer_idx, stream=None):
        pass

    def save_kv_layer(self, layer_idx, stream=None):
        pass

    def wait_for_save(self, stream=None):
        self.core.save()

    def get_finished(self, finished_gen_req_ids, started_loading_req_ids):
        for i in list(finished_gen_req_ids) + list(started_loading_req_ids):
            self._ids[str(i)] = i
        self.core.loading.update(str(i) for i in started_loading_req_ids)
        sending, recving = self.core.finished([str(i) for i in finished_gen_req_ids], all_delayed=True)
        return [self._ids.pop(s, s) for s in sending], [self._ids.pop(r, r) for r in recving]

    def kvmesh_errors(self):
        return dict(self.core.client.errors)
